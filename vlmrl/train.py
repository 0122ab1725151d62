"""Entry point: ``python -m vlmrl.train [--config-name tiny_cpu] key=value ...`` (Hydra over the typed schema).

Every override is answered before Hydra or anything expensive starts (``vlmrl.config.translate``): a vlmrl key is
kept; a verl key is aliased, accepted with a printed notice, or refused naming its feature; an unknown key is refused
naming the nearest valid one. The composed config then passes the value checks. A configuration error exits with
status 2 and every problem on stderr. ``trainer.dry_run=True`` runs every check that needs no accelerator, prints the
plan and exits (0: the run would start; 2: the problems). Hydra's own flags work as usual (``--cfg job``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

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
    from vlmrl.trainer.grpo import RunStopped, fit

    try:
        last = fit(typed)
    except ConfigError as e:
        _config_error(str(e))
    except RunStopped as e:
        print(f"vlmrl: run stopped at {e}", file=sys.stderr, flush=True)
        sys.exit(1)
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


VERL_CONFIGS = {"ppo_trainer": None, "ppo_megatron_trainer": "the Megatron-LM backend (vlmrl trains with FSDP2)"}
"""verl's own top-level config names: ppo_trainer is what vlmrl's grpo config stands for; the others are refused."""


def _flatten(doc: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The leaves of a nested mapping as (dotted key, value); lists are values."""
    out: list[tuple[str, Any]] = []
    for k, v in doc.items():
        key = f"{prefix}{k}"
        out += _flatten(v, key + ".") if isinstance(v, dict) and v else [(key, v)]
    return out


def _config_args(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Hydra's ``--config-path`` / ``--config-name`` as verl scripts pass them: verl's ``ppo_trainer`` is dropped
    (vlmrl's own ``grpo`` config takes its place); a config file built on it (``defaults: [ppo_trainer, _self_]``, as
    verl's multi-turn examples ship) is read as overrides that come before the command line's, so each of its keys
    gets the same answer as on the command line and the command line wins; a Megatron config is refused naming it.
    Returns (the arguments left for Hydra, problems, notices)."""
    import yaml

    from vlmrl.config.verl import render

    out: list[str] = []
    name = path = None
    i = 0
    while i < len(argv):
        a = argv[i]
        for flag in ("--config-name", "-cn", "--config-path", "-cp"):
            if a == flag and i + 1 < len(argv):
                value, i = argv[i + 1], i + 1
                break
            if a.startswith(flag + "="):
                value = a.split("=", 1)[1]
                break
        else:
            out.append(a)
            i += 1
            continue
        if flag in ("--config-name", "-cn"):
            name = value.strip("'\"")
        else:
            path = value.strip("'\"")
        i += 1
    if name is None:
        return out + ([f"--config-path={path}"] if path else []), [], []
    stem = name.removesuffix(".yaml")
    if stem in VERL_CONFIGS:
        why = VERL_CONFIGS[stem]
        problems = [f"--config-name={name}: verl's {stem} config; not implemented in vlmrl: {why}."] if why else []
        return out, problems, []
    if path is not None:
        file = os.path.join(path, stem + ".yaml")
        try:
            with open(file, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
        except FileNotFoundError:
            return out, [f"--config-name={name}: no such config file {file} (--config-path={path})."], []
        except (OSError, yaml.YAMLError) as e:
            return out, [f"--config-name={name}: cannot read {file}: {e}"], []
        if not isinstance(doc, dict):
            return out, [f"--config-name={name}: {file} is not a mapping of settings."], []
        defaults = doc.get("defaults") or []
        parents = {str(d).split(":")[0].strip() for d in defaults if isinstance(d, str)}
        parents |= {str(k) for d in defaults if isinstance(d, dict) for k in d}
        verl_parents = parents & set(VERL_CONFIGS)
        if verl_parents:
            for parent in sorted(verl_parents):
                if VERL_CONFIGS[parent]:
                    return out, [f"--config-name={name} ({file}) builds on verl's {parent} config; not "
                                 f"implemented in vlmrl: {VERL_CONFIGS[parent]}."], []  # fmt: skip
            others = sorted(parents - verl_parents - {"_self_"})
            if others:
                return out, [f"--config-name={name} ({file}): its defaults {others} are verl config groups vlmrl "
                             "does not have; pass their settings as key=value overrides."], []  # fmt: skip
            settings = {k: v for k, v in doc.items() if k not in ("defaults", "hydra")}
            leaves = _flatten(settings)
            note = (f"--config-name={name}: verl's config file {file} read as {len(leaves)} override(s) on vlmrl's "
                    "grpo config (the command line's come after it and win).")  # fmt: skip
            return [f"{k}={render(v)}" for k, v in leaves] + out, [], [note]
    return out + [f"--config-name={name}"] + ([f"--config-path={path}"] if path else []), [], []


def _bare_engine_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """verl's example scripts read their engine from ``$1`` (``ENGINE=${1:-vllm}``) and pass ``$@`` on, so the engine
    name reaches the trainer as a bare word: drop a bare word equal to the line's ``actor_rollout_ref.rollout.name``,
    with a notice. Any other bare word is left for Hydra to refuse."""
    engines = {
        a.split("=", 1)[1].strip("'\"") for a in argv if a.lstrip("+").startswith("actor_rollout_ref.rollout.name=")
    }
    out, notices = [], []
    for a in argv:
        if "=" not in a and not a.startswith("-") and a in engines:
            notices.append(f"'{a}': a bare argument equal to actor_rollout_ref.rollout.name (verl's scripts pass "
                           "their ENGINE argument on to the trainer): ignored.")  # fmt: skip
            continue
        out.append(a)
    return out, notices


def main() -> None:
    """Answer the overrides, then hand over to Hydra (which composes the config and calls the trainer)."""
    import hydra

    from vlmrl import configs_dir
    from vlmrl.config import register, translate

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args, config_problems, config_notices = _config_args(sys.argv[1:])
    args, bare_notices = _bare_engine_args(args)
    t = translate(args)
    t.problems[:0] = config_problems
    t.notices[:0] = config_notices + bare_notices
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
