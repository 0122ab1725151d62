"""Run a verl launch script unchanged, with vlmrl as the trainer:

    python -m vlmrl.run_verl path/to/verl/examples/grpo_trainer/run_qwen2_5_vl-7b.sh [script args...]
    python -m vlmrl.run_verl run_qwen2_5_vl-7b.sh vllm trainer.dry_run=True       # check it, start nothing

The script runs in bash as it is; its ``python3 -m verl.trainer.main_ppo ...`` (or ``python -m ...``) starts
``python -m vlmrl.train ...`` with the same arguments instead (a ``python3``/``python`` shim first on ``PATH`` does
that; every other Python command the script runs reaches the real interpreter). Arguments after the script go to the
script, as with ``bash script.sh ...`` (verl's scripts pass ``$@`` on to the trainer).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

VERL_ENTRY_POINTS = ("verl.trainer.main_ppo",)
"""``-m`` modules of verl that the shim hands to ``vlmrl.train``."""

_SHIM = """#!/bin/sh
# vlmrl.run_verl: verl's trainer -> vlmrl's; anything else -> the real interpreter
if [ "$1" = "-m" ] && {cases}; then
  shift 2
  exec {python} -m vlmrl.train "$@"
fi
exec {python} "$@"
"""


def write_shims(folder: Path, python: str = sys.executable) -> Path:
    """``python3`` and ``python`` shims in ``folder`` (created); returns the folder to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    cases = " || ".join(f'[ "$2" = {shlex.quote(m)} ]' for m in VERL_ENTRY_POINTS)
    text = _SHIM.format(cases="{ " + cases + "; }", python=shlex.quote(python))
    for name in ("python3", "python"):
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder


def run(script: str | os.PathLike, args: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> int:
    """Run ``bash script args`` with the shims first on PATH; returns its exit status."""
    with tempfile.TemporaryDirectory(prefix="vlmrl-verl-") as tmp:
        shims = write_shims(Path(tmp))
        full_env = dict(os.environ if env is None else env)
        full_env["PATH"] = f"{shims}{os.pathsep}{full_env.get('PATH', '')}"
        return subprocess.call(["bash", str(script), *args], env=full_env, cwd=cwd)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m vlmrl.run_verl SCRIPT [ARGS...]``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    script = Path(argv[0])
    if not script.is_file():
        print(f"vlmrl.run_verl: {script}: no such file", file=sys.stderr)
        return 2
    return run(script, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
