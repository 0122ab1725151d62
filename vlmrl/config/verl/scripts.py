"""verl's launch scripts run unchanged with vlmrl as the trainer (``python -m vlmrl.run_verl SCRIPT [ARGS...]``).

The script runs in bash as it is; its ``python3 -m verl.trainer.main_ppo ...`` (or ``python -m ...``; the
interpreter's own options before ``-m``, as in ``python3 -u -m ...``, are kept) starts ``python -m vlmrl.train ...``
with the same arguments instead (a ``python3``/``python`` shim first on ``PATH`` does that; every other Python command
the script runs reaches the real interpreter). Arguments after the script go to the script, as with
``bash script.sh ...`` (verl's scripts pass ``$@`` on to the trainer). :func:`commands` runs the script the same way
but records the trainer commands instead of starting them (``python -m vlmrl.run_verl --print SCRIPT``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

VERL_ENTRY_POINTS = {
    "verl.trainer.main_ppo": "",
    "verl.experimental.one_step_off_policy.main_ppo": "--config-name=one_step_off_ppo_trainer",
    "recipe.one_step_off_policy.async_main_ppo": "--config-name=one_step_off_ppo_trainer",
    "verl.experimental.fully_async_policy.fully_async_main": "--config-name=fully_async_ppo_trainer",
    "recipe.fully_async_policy.fully_async_main": "--config-name=fully_async_ppo_trainer",
}
"""``-m`` modules of verl that the shim hands to ``vlmrl.train``, and the options they add first (verl's one-step
off-policy and fully asynchronous trainers: their configs, ``configs/one_step_off_ppo_trainer.yaml`` and
``configs/fully_async_ppo_trainer.yaml``; a ``--config-name`` of the script's own comes later and wins)."""

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
_RECORD = """    n=$(ls {record} | grep -c args)  # the trainer's command and environment; the script goes on (status 0)
    printf '%s\\0' "$@" > {record}/$n.args
    env -0 > {record}/$n.env
    exit 0
"""


def write_shims(folder: Path, python: str = sys.executable, record: Path | None = None) -> Path:
    """``python3`` and ``python`` shims in ``folder`` (created); returns the folder to put first on PATH. With
    ``record`` (an existing folder), a trainer command is written there (``N.args``: its arguments, ``N.env``: its
    environment, NUL-separated) instead of started."""
    folder.mkdir(parents=True, exist_ok=True)
    cases = "|".join(shlex.quote(m) for m in VERL_ENTRY_POINTS)
    extras = "\n".join(f"  {shlex.quote(m)}) extra={shlex.quote(o)} ;;" for m, o in VERL_ENTRY_POINTS.items() if o)
    text = _SHIM.format(cases=cases, extras=extras, python=shlex.quote(python))
    if record is not None:
        text = text.replace(
            '    shift "$total"\n', '    shift "$total"\n' + _RECORD.format(record=shlex.quote(str(record)))
        )
    for name in ("python3", "python"):
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder


@dataclass
class TrainerCommand:
    """A trainer command a verl script ran (as vlmrl runs it)."""

    python_options: list[str]
    """The interpreter's own options before ``-m`` (``-u``)."""
    argv: list[str]
    """``vlmrl.train``'s arguments (the script's, after the options the entry point adds)."""
    exported: dict[str, str]
    """Environment variables the script set or changed before the command (``PATH`` and bash's own left out)."""

    def line(self) -> str:
        """The command as a shell line."""
        return shlex.join(["python", *self.python_options, "-m", "vlmrl.train", *self.argv])


@dataclass
class Recorded:
    """What :func:`commands` saw."""

    returncode: int
    """The script's exit status, each trainer command counted as succeeding."""
    commands: list[TrainerCommand]
    stdout: str
    stderr: str


_BASH_OWN = {"PATH", "PWD", "OLDPWD", "SHLVL", "_"}


def commands(
    script: str | os.PathLike, args: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> Recorded:
    """Run ``bash script args`` as :func:`run` does, recording each trainer command instead of starting it; every
    other command of the script runs."""
    base = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="vlmrl-verl-") as tmp:
        record = Path(tmp) / "record"
        record.mkdir()
        shims = write_shims(Path(tmp) / "bin", record=record)
        full_env = {**base, "PATH": f"{shims}{os.pathsep}{base.get('PATH', '')}"}
        proc = subprocess.run(["bash", str(script), *args], env=full_env, cwd=cwd, capture_output=True, text=True)
        found = []
        for k in range(len(list(record.glob("*.args")))):
            words = (record / f"{k}.args").read_text().split("\0")[:-1]
            at = words.index("-m")
            seen = dict(kv.split("=", 1) for kv in (record / f"{k}.env").read_text().split("\0") if "=" in kv)
            exported = {k2: v for k2, v in seen.items() if base.get(k2) != v and k2 not in _BASH_OWN}
            found.append(TrainerCommand(words[:at], words[at + 2 :], exported))
    return Recorded(proc.returncode, found, proc.stdout, proc.stderr)


def run(script: str | os.PathLike, args: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> int:
    """Run ``bash script args`` with the shims first on PATH; returns its exit status."""
    with tempfile.TemporaryDirectory(prefix="vlmrl-verl-") as tmp:
        shims = write_shims(Path(tmp))
        full_env = dict(os.environ if env is None else env)
        full_env["PATH"] = f"{shims}{os.pathsep}{full_env.get('PATH', '')}"
        return subprocess.call(["bash", str(script), *args], env=full_env, cwd=cwd)
