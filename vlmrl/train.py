"""Entry point: ``python -m vlmrl.train [--config-name tiny_cpu] key=value ...`` (Hydra over the typed schema).

Every override is answered before Hydra or anything expensive starts (``vlmrl.config.translate``): a vlmrl key is
kept; a verl key is aliased, accepted with a printed notice, or refused naming its feature; an unknown key is refused
naming the nearest valid one. The composed config then passes the value checks. A configuration error exits with
status 2 and every problem on stderr. ``trainer.dry_run=True`` runs every check that needs no accelerator, prints the
plan and exits (0: the run would start; 2: the problems). Hydra's own flags work as usual (``--cfg job``).

A run that fails while starting (a worker that cannot load the model, an engine that does not start, a tool file that
does not import, Ray refused or short of resources) prints one line, ``vlmrl: start-up failed: <what>: <cause>;
<what to check> (traceback: <log>)``, and exits with status 2; the tracebacks go to ``trainer.default_local_dir``/
startup_error.log (a temporary file when that folder cannot be written). A failure once training runs stops it with
``vlmrl: run stopped at step N: ...`` (exit 1).

A ``--config-name`` file is settings, not code: no key of it may reach Hydra's own config (``hydra.*``, a
``hydra/`` defaults group); see ``_config_args``.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, NoReturn

from omegaconf import DictConfig

CONFIG_ERROR_EXIT = 2
"""Exit status of a run refused for its configuration."""
STARTUP_ERROR_EXIT = 2
"""Exit status of a run that could not start for a reason the person launching it can fix (a model folder that does
not load, an engine that does not start, Ray refused): one line on stderr, the tracebacks in a log file."""

_PENDING: dict[str, list[str]] = {"problems": [], "notices": []}
"""What translating the overrides found, carried into the dry run (which lists every problem at once)."""


def _config_error(message: str) -> NoReturn:
    print(f"vlmrl: config error: {message}", file=sys.stderr, flush=True)
    sys.exit(CONFIG_ERROR_EXIT)


STARTUP_LOG = "startup_error.log"
"""The file (in ``trainer.default_local_dir``) that holds the tracebacks of a run that could not start."""

DRIVER_STEPS: tuple[tuple[str, str, str], ...] = (
    ("_find_resume", "could not find the checkpoint to resume from",
     "check trainer.resume_mode and trainer.resume_from_path, or start over with trainer.resume_mode=disable"),
    ("_load_checkpoint", "could not resume from the checkpoint in {out}",
     "check it, or start over with trainer.resume_mode=disable"),
    ("vlmrl/workers/", "the workers did not start", ""),
    ("vlmrl/tools/", "could not load the tools of {tools}",
     "fix the tool file it names, or actor_rollout_ref.rollout.multi_turn.tool_config_path"),
    ("vlmrl/data/", "could not read the data",
     "check data.train_files and data.val_files (trainer.dry_run=True checks every record)"),
    ("vlmrl/reward/", "could not start the reward", "check reward.function / custom_reward_function.*"),
    ("vlmrl/trainer/tracking", "could not start the loggers", "check trainer.logger"),
    ("mkdir", "could not create trainer.default_local_dir={out}", "check trainer.default_local_dir"),
    ("transformers/", "could not load the model's processor from {path}", "check actor_rollout_ref.model.path"),
)  # fmt: skip
"""What failed while the trainer started, by where the failing call went (as ``vlmrl.workers.group.WORKER_STEPS``:
a path fragment or a function name of a frame below ``Trainer.__init__``, the first rule that matches wins)."""


def _starting(e: BaseException) -> Any:
    """The frame of ``Trainer.__init__`` that ``e`` left (the run was starting), or None (it was training)."""
    from vlmrl.trainer.grpo import Trainer

    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is Trainer.__init__.__code__:
            return tb.tb_frame
        tb = tb.tb_next
    return None


def startup_summary(e: BaseException, cfg: Any) -> tuple[str, str]:
    """(one line: what failed, its cause and what to check; the failing worker's traceback or "") for an exception
    raised while the trainer of ``cfg`` was starting."""
    from vlmrl.trainer.grpo import Trainer
    from vlmrl.workers.group import StartupFailure, WorkerError, error_text, frames_below, one_line, step_of

    failure = getattr(e, "failure", None)
    if isinstance(failure, StartupFailure):
        what, cause, hint, details = failure.what, failure.cause, failure.hint, failure.details
    else:
        step = step_of(frames_below(e, Trainer.__init__.__code__), DRIVER_STEPS)
        what, hint = step or ("the trainer could not start", "")
        arr = cfg.actor_rollout_ref
        what = what.format(path=arr.model.path, tools=arr.rollout.multi_turn.tool_config_path,
                           out=cfg.trainer.default_local_dir)  # fmt: skip
        cause, details = (one_line(str(e)) if isinstance(e, WorkerError) else error_text(e)), ""
    return f"{what}: {cause}" + (f"; {hint}" if hint else ""), details


def _write_log(folder: str, text: str) -> str:
    """Write ``text`` to ``folder``/startup_error.log, or to a new temporary file when that cannot be written; returns
    the path."""
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.abspath(os.path.join(folder, STARTUP_LOG))
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    except OSError:
        fd, path = tempfile.mkstemp(prefix="vlmrl-startup-error-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path


def _startup_error(e: BaseException, cfg: Any) -> NoReturn:
    """A run that could not start: end what it had started, write the tracebacks to a log file, and print one line
    naming what failed, the cause, what to check and the log (exit status 2)."""
    import contextlib
    import datetime
    import io
    import traceback

    summary, details = startup_summary(e, cfg)
    frame = _starting(e)
    trainer = frame.f_locals.get("self") if frame is not None else None  # what Trainer.__init__ had built
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):  # what closing prints goes to the log
        for part, close in (("group", "shutdown"), ("rewards", "close"), ("tracker", "close")):
            obj = getattr(trainer, part, None)
            try:
                if obj is not None:
                    getattr(obj, close)(**({"grace_s": 1.0} if close == "shutdown" else {}))
            except Exception as err:  # noqa: BLE001 - cleaning up after a failure must not hide it
                print(f"closing {part}: {type(err).__name__}: {err}")
    text = (
        f"vlmrl: the run could not start ({datetime.datetime.now().isoformat(timespec='seconds')})\n{summary}\n\n"
        f"The driver's traceback:\n{''.join(traceback.format_exception(type(e), e, e.__traceback__))}"
        + (f"\nThe worker's traceback:\n{details}" if details else "")
        + (f"\nWhile ending what had started:\n{said.getvalue()}" if said.getvalue() else "")
    )
    log = _write_log(str(cfg.trainer.default_local_dir), text)
    print(f"vlmrl: start-up failed: {summary} (traceback: {log})", file=sys.stderr, flush=True)
    sys.exit(STARTUP_ERROR_EXIT)


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
        os.remove(os.path.join(typed.trainer.default_local_dir, STARTUP_LOG))  # an earlier start's
    except OSError:
        pass
    try:
        last = fit(typed)
    except ConfigError as e:
        _config_error(str(e))
    except RunStopped as e:
        print(f"vlmrl: run stopped at {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Exception as e:
        if _starting(e) is None:
            raise  # a failure while training that RunStopped does not cover: the traceback, as before
        _startup_error(e, typed)
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


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
"""A setting's name in a config file: letters, digits, ``_`` and ``-``, dotted parts allowed (``a.b: 1``)."""

MAX_CONFIG_FILES = 1000
"""The most files a ``--config-path`` / ``--config-dir`` folder may hold for its YAML files to be checked."""


def names_hydra(key: Any) -> bool:
    """True when a key or a defaults entry, as a config file or an override writes it (``hydra.callbacks``,
    ``+hydra``, ``~hydra.run``, ``override hydra/job_logging``, ``/hydra/launcher``, ``db@hydra.job``), reaches
    Hydra's own config (its ``hydra`` node or one of its ``hydra/`` groups)."""
    text = str(key).strip()
    for word in ("override ", "optional "):
        text = text.removeprefix(word).strip()
    text = text.lstrip("+~/ ")
    group, _, package = text.partition("@")
    first = re.split(r"[./:\s]", group, maxsplit=1)[0]
    return first == "hydra" or package.strip().removeprefix("_global_.").split(".")[0] == "hydra"


def _defaults_entries(defaults: Any) -> list[str]:
    """The names a defaults list holds: its strings and the keys of its mappings."""
    if not isinstance(defaults, list):
        return []
    return [str(d) for d in defaults if not isinstance(d, dict)] + [str(k) for d in defaults if isinstance(d, dict)
                                                                    for k in d]  # fmt: skip


def verl_file_problems(doc: dict[str, Any], where: str) -> list[str]:
    """Keys of a verl config file read as overrides (built on ``ppo_trainer``) that are not settings: any that would
    reach Hydra's own config (its ``hydra:`` section, but for ``searchpath``, which points Hydra at verl's configs and
    is ignored: vlmrl's grpo config stands for them; ``+hydra...``, ``hydra.callbacks...``; a ``hydra/`` defaults
    entry), and any key that is not a setting's name (``+x``, ``a=b``, ``x/y``: override syntax, not data)."""
    problems = []
    why = "a config file holds settings only (Hydra's own options, such as hydra.callbacks, run code): pass them on "
    why += "the command line"
    for entry in _defaults_entries(doc.get("defaults")):
        if names_hydra(entry):
            problems.append(f"{where}: its defaults entry '{entry}' names Hydra's own config; {why}.")

    def walk(node: dict[Any, Any], path: str) -> None:
        for k, v in node.items():
            key = f"{path}{k}"
            if not path and k == "defaults":
                continue
            if not path and k == "hydra" and isinstance(v, dict):
                problems.extend(f"{where}: 'hydra.{sub}' would set Hydra's own config; {why}."
                                for sub in v if sub != "searchpath")  # fmt: skip
            elif names_hydra(k) and not path:
                problems.append(f"{where}: '{k}' would set Hydra's own config; {why}.")
            elif not _PLAIN_KEY.match(str(k)):
                problems.append(f"{where}: '{key}' is not a setting's name (letters, digits, _ and -, dotted).")
            elif isinstance(v, dict):
                walk(v, key + ".")

    walk(doc, "")
    return problems


MAX_CONFIG_BYTES = 5_000_000
"""The largest YAML file of such a folder that is checked; a larger one is refused."""


def _hydra_parts(file: str) -> list[str]:
    """What of a YAML file would reach Hydra's own config, each as the text to name it by: a top-level key
    (``'hydra'``, ``'+hydra.callbacks'``), a ``# @package hydra...`` header, a defaults entry naming a ``hydra/``
    group or package. A file that is not YAML gives none (Hydra cannot compose it either)."""
    import yaml

    try:
        if os.path.getsize(file) > MAX_CONFIG_BYTES:
            return [f"a file of over {MAX_CONFIG_BYTES // 1_000_000} MB (too large to check)"]
        with open(file, encoding="utf-8") as f:
            text = f.read()
        doc = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    doc = doc if isinstance(doc, dict) else {}
    parts = [f"'{k}'" for k in doc if k != "defaults" and names_hydra(k)]
    header = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
    if header and names_hydra("@" + header.group(1)):
        parts.append(f"'# @package {header.group(1)}'")
    parts += [f"its defaults entry '{e}'" for e in _defaults_entries(doc.get("defaults")) if names_hydra(e)]
    return parts


def hydra_config_problems(folders: list[str]) -> list[str]:
    """YAML files that Hydra would compose as its own config (every one under the ``--config-path`` /
    ``--config-dir`` folders, other than vlmrl's configs) and that set Hydra's own config (``_hydra_parts``). Such a
    file is refused (Hydra's ``hydra.callbacks`` instantiates classes: code), as is a folder too large to check."""
    from vlmrl import configs_dir

    ours = os.path.realpath(configs_dir())
    problems: list[str] = []
    seen = 0
    for folder in dict.fromkeys(os.path.realpath(f) for f in folders if os.path.isdir(f)):
        if folder == ours:
            continue
        for root, dirs, files in os.walk(folder, followlinks=True):  # Hydra follows links too
            dirs.sort()
            seen += len(files) + len(dirs)
            if seen > MAX_CONFIG_FILES:
                return problems + [f"{folder}: more than {MAX_CONFIG_FILES} files to check for Hydra settings; "
                                   "point --config-path / --config-dir at a folder of config files."]  # fmt: skip
            for name in sorted(files):
                if name.endswith((".yaml", ".yml")):
                    file = os.path.join(root, name)
                    problems += [f"{file}: {part} would set Hydra's own config; a config file holds settings only "
                                 "(Hydra's own options, such as hydra.callbacks, run code): pass them on the command "
                                 "line." for part in _hydra_parts(file)]  # fmt: skip
    return problems


def _config_args(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Hydra's ``--config-path`` / ``--config-name`` as verl scripts pass them: verl's ``ppo_trainer`` is dropped
    (vlmrl's own ``grpo`` config takes its place); a config file built on it (``defaults: [ppo_trainer, _self_]``, as
    verl's multi-turn examples ship) is read as overrides that come before the command line's, so each of its keys
    gets the same answer as on the command line and the command line wins; a Megatron config is refused naming it.

    A config file is settings, not code: a verl file's key that would reach Hydra's own config (``hydra.callbacks``
    instantiates classes) is refused naming the file and the key (``verl_file_problems``); so is any YAML file of a
    ``--config-path`` / ``--config-dir`` folder (other than vlmrl's configs) that Hydra would compose with such a key
    (``hydra_config_problems``). Hydra options typed on the command line are the launcher's own, and kept.
    Returns (the arguments left for Hydra, problems, notices)."""
    import yaml

    from vlmrl.config.verl import render

    out: list[str] = []
    name = path = None
    dirs = [a.split("=", 1)[1] if "=" in a else b for a, b in zip(argv, argv[1:] + [""])
            if a.split("=", 1)[0] in ("--config-dir", "-cd")]  # fmt: skip
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
    here = os.path.dirname(os.path.abspath(__file__))  # Hydra reads a relative --config-path from this module's folder
    passed = [path, os.path.join(here, path)] if path else []
    if name is None:
        if bad := hydra_config_problems(passed + dirs):
            return _without_config_dirs(out), bad, []  # Hydra never reads them, not even for a dry run
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
        where = f"--config-name={name} ({file})"
        defaults = doc.get("defaults") or []
        parents = {str(d).split(":")[0].strip() for d in defaults if isinstance(d, str)}
        parents |= {str(k) for d in defaults if isinstance(d, dict) for k in d}
        verl_parents = parents & set(VERL_CONFIGS)
        if verl_parents and (bad := verl_file_problems(doc, where) + hydra_config_problems(dirs)):
            return _without_config_dirs(out), bad, []
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
    bad = hydra_config_problems(passed + dirs)
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        bad.append(f"--config-name={name}: name a config file inside --config-path, --config-dir or vlmrl's configs "
                   "(no absolute path, no '..').")  # fmt: skip
    if bad:
        return _without_config_dirs(out), bad, []  # Hydra never reads them, not even for a dry run
    return out + [f"--config-name={name}"] + ([f"--config-path={path}"] if path else []), [], []


def _without_config_dirs(argv: list[str]) -> list[str]:
    """``argv`` without Hydra's ``--config-dir`` / ``-cd`` arguments."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--config-dir", "-cd"):
            skip = True
        elif not a.startswith(("--config-dir=", "-cd=")):
            out.append(a)
    return out


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
