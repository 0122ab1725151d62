"""Entry point: ``python -m vlmrl.train [--config-name tiny_cpu] key=value ...`` (Hydra over the typed schema).

Every override is checked against the schema before Hydra or anything expensive starts: an unknown key is an error
naming the nearest valid one, and verl options vlmrl does not implement are rejected with the reason. A configuration
error (also one found after composing: a missing mandatory key, an unsupported value, a ``check_config`` failure)
exits with status 2 and the message on stderr. Hydra's own flags work as usual, e.g. ``--cfg job`` prints the
composed configuration without training.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from omegaconf import DictConfig

CONFIG_ERROR_EXIT = 2
"""Exit status of a run refused for its configuration."""


def _config_error(e: Exception) -> NoReturn:
    print(f"vlmrl: config error: {e}", file=sys.stderr, flush=True)
    sys.exit(CONFIG_ERROR_EXIT)


def _run(cfg: DictConfig) -> None:
    from vlmrl.config import ConfigError, to_object

    try:
        typed = to_object(cfg)  # before torch / Ray are imported: a bad value is reported at once
        from vlmrl.trainer.grpo import fit

        last = fit(typed)
    except ConfigError as e:
        _config_error(e)
    keys = [k for k in ("reward/mean", "val/reward/mean", "timing/step_s") if k in last]
    print("[vlmrl] done: " + ", ".join(f"{k}={last[k]:.4f}" for k in keys), flush=True)


def main() -> None:
    """Validate the override keys, then hand over to Hydra (which composes the config and calls the trainer)."""
    import hydra

    from vlmrl import configs_dir
    from vlmrl.config import ConfigError, normalize_overrides, register, validate_overrides

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.argv[1:] = normalize_overrides(sys.argv[1:])  # hydra.main parses sys.argv
    overrides = [a for a in sys.argv[1:] if not a.startswith("-") and "=" in a]
    try:
        validate_overrides(overrides)
    except ConfigError as e:
        _config_error(e)
    register()
    hydra.main(config_path=str(configs_dir()), config_name="grpo", version_base=None)(_run)()


if __name__ == "__main__":
    main()
