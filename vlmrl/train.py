"""Entry point: ``python -m vlmrl.train [--config-name tiny_cpu] key=value ...`` (Hydra over the typed schema).

Every override is checked against the schema before Hydra or anything expensive starts: an unknown key is an error
naming the nearest valid one, and verl options vlmrl does not implement are rejected with the reason.
"""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig


def _run(cfg: DictConfig) -> None:
    from vlmrl.config import to_object
    from vlmrl.trainer.grpo import fit

    last = fit(to_object(cfg))
    keys = [k for k in ("reward/mean", "val/reward/mean", "timing/step_s") if k in last]
    print("[vlmrl] done: " + ", ".join(f"{k}={last[k]:.4f}" for k in keys), flush=True)


def main() -> None:
    """Validate overrides, then hand over to Hydra."""
    import hydra

    from vlmrl import configs_dir
    from vlmrl.config import ConfigError, register, validate_overrides

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    overrides = [a for a in sys.argv[1:] if not a.startswith("-") and "=" in a]
    try:
        validate_overrides(overrides)
    except ConfigError as e:
        print(f"vlmrl: config error: {e}", file=sys.stderr)
        sys.exit(2)
    register()
    hydra.main(config_path=str(configs_dir()), config_name="grpo", version_base=None)(_run)()


if __name__ == "__main__":
    main()
