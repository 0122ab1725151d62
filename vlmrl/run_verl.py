"""Run a verl launch script unchanged, with vlmrl as the trainer:

    python -m vlmrl.run_verl path/to/verl/examples/grpo_trainer/run_qwen2_5_vl-7b.sh [script args...]
    python -m vlmrl.run_verl run_qwen2_5_vl-7b.sh vllm trainer.dry_run=True       # check it, start nothing
    python -m vlmrl.run_verl --print run_qwen2_5_vl-7b.sh vllm     # the vlmrl.train command(s) it would run

The script runs in bash as it is; its ``python3 -m verl.trainer.main_ppo ...`` (also ``python3 -u -m ...``) starts
``python -m vlmrl.train`` with the same arguments (``vlmrl.config.verl.scripts``); verl's one-step off-policy trainer,
``python3 -m verl.experimental.one_step_off_policy.main_ppo`` (older: ``recipe.one_step_off_policy.async_main_ppo``),
starts it with ``--config-name one_step_off_ppo_trainer`` first (verl's config of that trainer). Arguments after the
script go to the script. ``--print`` runs the script with each trainer command printed instead of started (with
the variables the script exported before it), and exits with the script's status.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from vlmrl.config.verl.scripts import commands, run


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m vlmrl.run_verl SCRIPT [ARGS...]``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    show = argv[0] == "--print"
    if show:
        argv = argv[1:]
    script = Path(argv[0]) if argv else Path("")
    if not script.is_file():
        print(f"vlmrl.run_verl: {script}: no such file", file=sys.stderr)
        return 2
    if not show:
        return run(script, argv[1:])
    rec = commands(script, argv[1:])
    print(rec.stdout, end="")
    print(rec.stderr, end="", file=sys.stderr)
    for cmd in rec.commands:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(cmd.exported.items()))
        print(f"{env} {cmd.line()}" if env else cmd.line())
    return rec.returncode


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    sys.exit(main())
