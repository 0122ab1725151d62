"""Entry point: ``python -m vlmrl.train [--config-name tiny_cpu] key=value ...`` (Hydra over the typed schema).

Every override is answered before Hydra or anything expensive starts (``vlmrl.config.translate``): a vlmrl key is
kept; a verl key is aliased, accepted with a printed notice, or refused naming its feature; an unknown key is refused
naming the nearest valid one. The composed config then passes the value checks. A configuration error exits with
status 2 and every problem on stderr. ``trainer.dry_run=True`` runs every check that needs no accelerator, prints the
plan and exits (0: the run would start; 2: the problems). Hydra's own flags work as usual (``--cfg job``).
"""

from __future__ import annotations

import sys
from typing import NoReturn

from omegaconf import DictConfig

CONFIG_ERROR_EXIT = 2
"""Exit status of a run refused for its configuration."""

_PENDING: dict[str, list[str]] = {"problems": [], "notices": []}
"""What translating the overrides found, carried into the dry run (which lists every problem at once)."""


def _config_error(message: str) -> NoReturn:
    print(f"vlmrl: config error: {message}", file=sys.stderr, flush=True)
    sys.exit(CONFIG_ERROR_EXIT)


def _run(cfg: DictConfig) -> None:
    from vlmrl.config import ConfigError, build

    typed, problems = build(cfg)  # before torch / Ray are imported: a bad value is reported at once
    dry = bool(cfg.get("trainer", {}).get("dry_run", False))
    if dry:
        from vlmrl import dry_run

        sys.exit(dry_run.run(typed, _PENDING["problems"] + problems, _PENDING["notices"]))
    if problems or typed is None:
        _config_error("\n".join(problems))
    from vlmrl.trainer.grpo import fit

    try:
        last = fit(typed)
    except ConfigError as e:
        _config_error(str(e))
    keys = [k for k in ("reward/mean", "val/reward/mean", "timing/step_s") if k in last]
    print("[vlmrl] done: " + ", ".join(f"{k}={last[k]:.4f}" for k in keys), flush=True)


def _wants_dry_run(overrides: list[str]) -> bool:
    from vlmrl.config.verl import parse_value

    for ov in overrides:
        if ov.lstrip("+").split("=", 1)[0] == "trainer.dry_run":
            try:
                return parse_value(ov.lstrip("+")) is True
            except Exception:  # noqa: BLE001 - a bad value is reported by the config check
                return False
    return False


def main() -> None:
    """Answer the overrides, then hand over to Hydra (which composes the config and calls the trainer)."""
    import os

    import hydra

    from vlmrl import configs_dir
    from vlmrl.config import register, translate

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t = translate(sys.argv[1:])
    if t.problems and not _wants_dry_run(sys.argv[1:]):
        _config_error("\n".join(t.problems))
    for note in dict.fromkeys(t.notices):
        print(f"[vlmrl] note: {note}", file=sys.stderr, flush=True)
    _PENDING.update(problems=t.problems, notices=[])
    sys.argv[1:] = t.overrides  # hydra.main parses sys.argv
    register()
    hydra.main(config_path=str(configs_dir()), config_name="grpo", version_base=None)(_run)()


if __name__ == "__main__":
    main()
