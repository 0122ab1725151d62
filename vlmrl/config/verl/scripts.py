"""verl's launch scripts run unchanged with vlmrl as the trainer (``python -m vlmrl.run_verl SCRIPT [ARGS...]``).

The script runs in bash as it is; its ``python3 -m verl.trainer.main_ppo ...`` (or ``python -m ...``; the
interpreter's own options before ``-m``, as in ``python3 -u -m ...``, are kept) starts ``python -m vlmrl.train ...``
with the same arguments instead (a ``python3``/``python`` shim first on ``PATH`` does that; every other Python command
the script runs reaches the real interpreter). Arguments after the script go to the script, as with
``bash script.sh ...`` (verl's scripts pass ``$@`` on to the trainer).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

VERL_ENTRY_POINTS = {
    "verl.trainer.main_ppo": "",
    "verl.experimental.one_step_off_policy.main_ppo": "--config-name=one_step_off_ppo_trainer",
    "recipe.one_step_off_policy.async_main_ppo": "--config-name=one_step_off_ppo_trainer",
}
"""``-m`` modules of verl that the shim hands to ``vlmrl.train``, and the options they add first (verl's one-step
off-policy trainer: its config, ``configs/one_step_off_ppo_trainer.yaml``; a ``--config-name`` of the script's own
comes later and wins)."""

_SHIM = """#!/bin/sh
# vlmrl.run_verl: verl's trainer -> vlmrl's; anything else -> the real interpreter.
# The interpreter's own options before -m (python3 -u -m ..., -B, -O, -X dev, -W ignore) are kept.
k=0; skip=0; module=""; drop=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then k=$((k + 1)); skip=0; continue; fi
  case "$a" in
    -m) drop=2; break ;;
    -m?*) module="${{a#-m}}"; drop=1; break ;;
    -X|-W) k=$((k + 1)); skip=1 ;;
    -c|-c?*|-|--|--*) break ;;
    -?*) k=$((k + 1)) ;;
    *) break ;;
  esac
done
if [ "$drop" = 2 ]; then
  i=0
  for a in "$@"; do
    i=$((i + 1))
    if [ "$i" = $((k + 2)) ]; then module="$a"; fi
  done
fi
extra=""
case "$module" in
{extras}
esac
case "$module" in
  {cases})
    total=$#; i=0
    for a in "$@"; do  # the same arguments with "-m <verl's module>" replaced by "-m vlmrl.train [its options]"
      i=$((i + 1))
      if [ "$i" = $((k + 1)) ]; then set -- "$@" -m vlmrl.train $extra
      elif [ "$i" -le "$k" ] || [ "$i" -gt $((k + drop)) ]; then set -- "$@" "$a"; fi
    done
    shift "$total"
    ;;
esac
exec {python} "$@"
"""


def write_shims(folder: Path, python: str = sys.executable) -> Path:
    """``python3`` and ``python`` shims in ``folder`` (created); returns the folder to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    cases = "|".join(shlex.quote(m) for m in VERL_ENTRY_POINTS)
    extras = "\n".join(f"  {shlex.quote(m)}) extra={shlex.quote(o)} ;;" for m, o in VERL_ENTRY_POINTS.items() if o)
    text = _SHIM.format(cases=cases, extras=extras, python=shlex.quote(python))
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
