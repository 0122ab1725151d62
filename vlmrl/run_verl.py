"""Run a verl launch script unchanged, with vlmrl as the trainer:

    python -m vlmrl.run_verl path/to/verl/examples/grpo_trainer/run_qwen2_5_vl-7b.sh [script args...]
    python -m vlmrl.run_verl run_qwen2_5_vl-7b.sh vllm trainer.dry_run=True       # check it, start nothing

The script runs in bash as it is; its ``python3 -m verl.trainer.main_ppo ...`` (also ``python3 -u -m ...``) starts
``python -m vlmrl.train`` with the same arguments (``vlmrl.config.verl.scripts``); verl's one-step off-policy trainer,
``python3 -m verl.experimental.one_step_off_policy.main_ppo`` (older: ``recipe.one_step_off_policy.async_main_ppo``),
starts it with ``--config-name one_step_off_ppo_trainer`` first (verl's config of that trainer). Arguments after the
script go to the script.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vlmrl.config.verl.scripts import run


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
