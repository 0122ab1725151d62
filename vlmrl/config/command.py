"""The command line of ``python -m vlmrl.train``, composed into a checked config: the one way a run's config is made.

    argv ──parse──▶ Command (config name and folders, overrides, --cfg) ──compose──▶ Composed
         config files (verl's read as overrides, Hydra's own settings refused: ``files``, ``verl.files``)
         ──translate──▶ vlmrl overrides (verl keys answered, unknown keys named) ──Hydra's compose API──▶ DictConfig
         ──build──▶ VLMRLConfig + every problem of its values (``checks.check_values``)

Hydra's compose API composes and runs nothing else (no callbacks, launchers, output folders or logging set-up); the
options of Hydra's command line that vlmrl takes are ``--config-name`` / ``-cn``, ``--config-path`` / ``-cp`` (the
primary config folder; relative to the working folder), ``--config-dir`` / ``-cd`` (another folder to search) and
``--cfg job`` (print the composed config and exit). Every problem found on the way is collected, so the dry run
(``trainer.dry_run=True``) lists them all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vlmrl import configs_dir
from vlmrl.config import fully_async
from vlmrl.config.checks import check_values, machine_problems, unused_settings
from vlmrl.config.errors import ConfigError
from vlmrl.config.files import hydra_config_problems
from vlmrl.config.keys import translate
from vlmrl.config.plan import RunPlan, run_plan
from vlmrl.config.schema import CHOICES, LOGGERS, NULLABLE_CHOICES, AlgorithmConfig, VLMRLConfig
from vlmrl.config.verl import VALUE_REASONS, parse_value, render
from vlmrl.config.verl.files import VERL_CONFIGS, VERL_TRAINER_CONFIGS, bare_engine_args, read_config_file, verl_parents

USAGE = """usage: python -m vlmrl.train [--config-name NAME] [--config-path DIR] [--config-dir DIR] [--cfg job]
                          key=value ...

Composes configs/<NAME>.yaml (default grpo; or NAME.yaml in --config-path) with the key=value overrides (vlmrl's
keys and verl's: vlmrl/config/schema.py, vlmrl/config/verl/rules.py) and trains. trainer.dry_run=True checks
everything and prints the plan instead; --cfg job prints the composed config."""

_FLAGS = {
    "--config-name": "name",
    "-cn": "name",
    "--config-path": "path",
    "-cp": "path",
    "--config-dir": "dir",
    "-cd": "dir",
    "--cfg": "cfg",
    "-c": "cfg",
}


@dataclass
class Command:
    """A parsed command line."""

    config_name: str = "grpo"
    config_path: str | None = None
    """The primary config folder (default: vlmrl's ``configs/``)."""
    config_dirs: list[str] = field(default_factory=list)
    """More folders Hydra searches (``--config-dir``)."""
    overrides: list[str] = field(default_factory=list)
    print_config: bool = False
    """``--cfg job``: print the composed config and exit."""
    help: bool = False
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


@dataclass
class Composed:
    """A command line composed: the typed config (None when it could not be made), the composed ``DictConfig`` and
    every problem and notice on the way."""

    cfg: VLMRLConfig | None
    raw: DictConfig | None
    problems: list[str]
    notices: list[str]
    dry_run: bool
    plan: RunPlan | None = None
    """What the gate derived from ``cfg`` (``config.plan.run_plan``), once: the dry run prints it, the trainer and
    its launchers read it (None when the config could not be built)."""


def parse(argv: list[str]) -> Command:
    """Sort ``argv`` into Hydra's options, overrides (``key=value``, ``+key=value``, ``~key``) and problems (an
    option vlmrl does not take, a bare word: verl's scripts pass their engine name as one, which is dropped)."""
    cmd = Command()
    args, cmd.notices = bare_engine_args(list(argv))
    i = 0
    while i < len(args):
        a = args[i]
        flag, eq, value = a.partition("=")
        if flag in _FLAGS and (eq or i + 1 < len(args)):
            if not eq:
                i, value = i + 1, args[i + 1]
            what, value = _FLAGS[flag], value.strip("'\"")
            if what == "name":
                cmd.config_name = value
            elif what == "path":
                cmd.config_path = value
            elif what == "dir":
                cmd.config_dirs.append(value)
            elif value in ("job", "all"):
                cmd.print_config = True
            else:
                cmd.problems.append(f"--cfg {value}: vlmrl prints the job's config only (--cfg job).")
        elif flag in _FLAGS:  # the last argument, without its value
            cmd.problems.append(f"'{a}' needs a value: {flag}=VALUE.")
        elif a in ("--help", "-h"):
            cmd.help = True
        elif a.startswith("-"):
            cmd.problems.append(
                f"'{a}': not an option of vlmrl.train (it takes --config-name, --config-path, "
                "--config-dir and --cfg job; one run per command, no --multirun)."
            )
        elif "=" in a or a.startswith("~"):
            cmd.overrides.append(a)
        else:
            cmd.problems.append(f"'{a}': a bare argument; overrides are key=value (python -m vlmrl.train --help).")
        i += 1
    return cmd


def _folder(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def _config_files(cmd: Command) -> tuple[list[str], list[str]]:
    """The overrides a verl config file named by ``--config-name`` stands for (read, then put before the command
    line's), and the problems of the config files and folders named. Mutates ``cmd.config_name`` to vlmrl's grpo for
    verl's own configs."""
    import yaml

    folders = [_folder(cmd.config_path)] if cmd.config_path else []
    folders += [_folder(d) for d in cmd.config_dirs]
    name, stem = cmd.config_name, cmd.config_name.removesuffix(".yaml")
    if stem in VERL_CONFIGS or stem in VERL_TRAINER_CONFIGS:  # verl's own (its --config-path is verl's folder)
        cmd.config_name, cmd.config_path = VERL_TRAINER_CONFIGS.get(stem, "grpo"), None
        return [], (
            [f"--config-name={name}: verl's {stem} config; not implemented in vlmrl: {VERL_CONFIGS[stem]}."]
            if VERL_CONFIGS.get(stem)
            else []
        )
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        return [], [
            f"--config-name={name}: name a config file inside --config-path, --config-dir or vlmrl's configs "
            "(no absolute path, no '..')."
        ]
    file = os.path.join(folders[0] if cmd.config_path else str(configs_dir()), stem + ".yaml")
    doc: Any = None
    if cmd.config_path:
        try:
            with open(file, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
        except FileNotFoundError:
            return [], [f"--config-name={name}: no such config file {file} (--config-path={cmd.config_path})."]
        except (OSError, yaml.YAMLError) as e:
            return [], [f"--config-name={name}: cannot read {file}: {e}"]
        if not isinstance(doc, dict):
            return [], [f"--config-name={name}: {file} is not a mapping of settings."]
    if isinstance(doc, dict) and verl_parents(doc)[0]:  # a verl file: read as overrides on vlmrl's grpo config
        overrides, problems, notices = read_config_file(doc, name, file)
        cmd.notices += notices
        cmd.config_name, cmd.config_path = "grpo", None
        return overrides, problems + hydra_config_problems([_folder(d) for d in cmd.config_dirs])
    return [], hydra_config_problems(folders)


def _hydra_compose(cmd: Command, overrides: list[str]) -> tuple[DictConfig | None, list[str]]:
    """Hydra's compose API over the primary folder (``--config-path`` or vlmrl's configs), searching the
    ``--config-dir`` folders and vlmrl's configs too; (the config, problems)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register()
    name = cmd.config_name.removesuffix(".yaml")
    search = [_folder(d) for d in cmd.config_dirs] + [str(configs_dir())]
    # the primary config's folder: --config-path, else the first folder that holds it (Hydra finds the primary
    # config there only; the others are searched for what its defaults name)
    ours = str(configs_dir())
    holding = [d for d in [ours, *search] if os.path.isfile(os.path.join(d, name + ".yaml"))]
    primary = _folder(cmd.config_path) if cmd.config_path else (holding[0] if holding else ours)
    # quoted by render: a folder name may hold ``,``, ``]`` or quotes
    searchpath = "hydra.searchpath=" + render([f"file://{d}" for d in dict.fromkeys(search) if d != primary])
    try:
        with initialize_config_dir(config_dir=primary, version_base=None):
            return compose(config_name=name, overrides=[*overrides, searchpath]), []
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException | ValueError) else None
        text = " ".join(str(e).split()) + (f": {str(cause).splitlines()[0]}" if cause and str(cause) else "")
        return None, [f"the config cannot be composed: {text}"]


def compose(
    argv: list[str] | Command, machine: bool = False, composed: Callable[[DictConfig], None] | None = None
) -> Composed:
    """The typed, checked config of a command line (or a parsed ``Command``), with every problem found: config
    files, overrides (``vlmrl.config.translate``), composition, types and values (``build``) and, with ``machine``
    (``python -m vlmrl.train``), the machine it would start on (``checks.machine_problems``; a dry run checks it
    itself, with the GPU plan too). ``composed`` is called with Hydra's composition as soon as there is one, before
    the checks (which import torch, seconds): the trainer starts its workers' imports there."""
    cmd = argv if isinstance(argv, Command) else parse(list(argv))
    file_overrides, file_problems = _config_files(cmd)
    t = translate(file_overrides + cmd.overrides)
    problems = cmd.problems + file_problems + t.problems
    notices = list(dict.fromkeys(cmd.notices + t.notices))
    dry = _wants_dry_run(cmd.overrides)
    raw, composition = (None, []) if file_problems else _hydra_compose(cmd, t.overrides)  # never compose bad files
    problems += composition
    if raw is not None and composed is not None and not problems:
        composed(raw)
    cfg, plan = None, None
    if raw is not None:
        cfg, value_problems = build(raw)
        problems += value_problems
        if cfg is not None:  # (after the value checks, which load algorithm.plugins: a plugin's estimator is known)
            plan = run_plan(cfg)
            unused, unused_notes = unused_settings(cfg, file_overrides + cmd.overrides, plan)
            problems += unused
            notices += unused_notes
        dry = bool(raw.get("trainer", {}).get("dry_run", dry))
        if machine and not dry and cfg is not None and not value_problems:  # (the dry run runs them itself)
            problems += machine_problems(cfg, plan)
    return Composed(cfg, raw, problems, notices, dry, plan)


def _wants_dry_run(overrides: list[str]) -> bool:
    """Whether the overrides ask for ``trainer.dry_run=True`` (read before composing: a dry run lists the problems
    that stop the composition too)."""
    for ov in overrides:
        if ov.lstrip("+").split("=", 1)[0] == "trainer.dry_run":
            try:
                return parse_value(ov.lstrip("+")) is True
            except Exception:  # noqa: BLE001 - a bad value is reported by the config check
                return False
    return False


def register() -> None:
    """Register the schema with Hydra's ConfigStore as ``vlmrl_schema``."""
    from hydra.core.config_store import ConfigStore

    schema = OmegaConf.structured(VLMRLConfig)
    OmegaConf.set_struct(schema.algorithm, False)  # a config file's algorithm block may hold the class's parameters
    ConfigStore.instance().store(name="vlmrl_schema", node=schema)


# mandatory keys (MISSING in the schema) and how to set them
_REQUIRED_HINTS: dict[str, str] = {
    "actor_rollout_ref.model.path": "point it at a Qwen-VL folder or hub id, "
    "e.g. actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-3B-Instruct",
    "data.train_files": "give a parquet file or a list of them (preprocess/ writes them), "
    "e.g. data.train_files=$HOME/data/geo3k/train.parquet",
}


def _choice_problems(cfg: VLMRLConfig) -> list[str]:
    problems = []
    for key, allowed in CHOICES.items():
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value not in allowed and not (value is None and key in NULLABLE_CHOICES):
            why = VALUE_REASONS.get((key, value))
            ok = " | ".join(allowed)
            problems.append(f"{key}={value!r}: {why + '; ' if why else ''}use {ok}.")
    return problems


def _normalize_logger(cfg: VLMRLConfig) -> list[str]:
    value = cfg.trainer.logger
    names = [value] if isinstance(value, str) else list(value or [])
    bad = [n for n in names if n not in LOGGERS]
    cfg.trainer.logger = [str(n) for n in names]
    if bad:
        return [f"trainer.logger: {bad} not available; use any of {', '.join(LOGGERS)}."]
    return []


def _class_parameters(cfg: DictConfig) -> DictConfig:
    """Keys of a config file's ``algorithm`` block that the schema does not know, moved under ``algorithm.params``
    (the arguments of ``algorithm.name``'s class, as ``+algorithm.x=...`` on the command line)."""
    alg = cfg.get("algorithm") if isinstance(cfg, DictConfig) else None
    if not isinstance(alg, DictConfig):
        return cfg
    known = set(AlgorithmConfig.__dataclass_fields__)
    extra = [k for k in alg.keys() if k not in known]
    if not extra:
        return cfg
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    params = cfg.algorithm.get("params") or {}
    for k in extra:
        params = {**params, str(k): cfg.algorithm[k]}
        cfg.algorithm.pop(k)
    cfg.algorithm.params = params
    return cfg


def build(cfg: DictConfig) -> tuple[VLMRLConfig | None, list[str]]:
    """Resolve interpolations, type the config and run every check of values (``checks.check_values``); returns the
    typed config (None when a mandatory key is unset) and every problem found."""
    cfg = _class_parameters(cfg)
    merged = OmegaConf.merge(OmegaConf.structured(VLMRLConfig), cfg)
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        what = "".join(f"\n  {k}: {_REQUIRED_HINTS.get(k, f'set it, e.g. {k}=...')}" for k in missing)
        return None, [f"Required setting(s) not given:{what}"]
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, VLMRLConfig)
    choices = _choice_problems(obj)
    resolved = fully_async.resolve(obj) if not choices else []
    return obj, choices + resolved + _normalize_logger(obj) + check_values(obj)


def load(overrides: list[str] | None = None, config_name: str = "grpo") -> VLMRLConfig:
    """The typed, checked config of ``configs/<config_name>.yaml`` with ``overrides``, composed as the command line
    composes it (``vlmrl.config.command``); ConfigError listing every problem."""
    composed = compose(Command(config_name=config_name, overrides=list(overrides or [])))
    if composed.problems or composed.cfg is None:
        raise ConfigError("\n".join(composed.problems))
    return composed.cfg
