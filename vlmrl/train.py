"""Entry point: ``python -m vlmrl.train [--config-name tiny_cpu] key=value ...``.

The command line is composed into a checked config (``vlmrl.config.command``: verl's config files and keys answered,
Hydra's compose API, every value checked); a configuration error exits with status 2 and every problem on stderr.
``trainer.dry_run=True`` runs every check that needs no accelerator, prints the plan and exits (0: the run would
start; 2: the problems); ``--cfg job`` prints the composed config.

A run that fails while starting (a worker that cannot load the model, an engine that does not start, a tool file that
does not import, Ray refused or short of resources) prints one line, ``vlmrl: start-up failed: <what>: <cause>;
<what to check> (traceback: <log>)``, and exits with status 2; the tracebacks go to ``trainer.default_local_dir``/
startup_error.log (a temporary file when that folder cannot be written). A failure once training runs stops it with
``vlmrl: run stopped at step N: ...`` (exit 1).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from vlmrl.config import ConfigError
from vlmrl.config.command import USAGE, compose, parse
from vlmrl.startup import StartupError

CONFIG_ERROR_EXIT = 2
"""Exit status of a run refused for its configuration."""
STARTUP_ERROR_EXIT = 2
"""Exit status of a run that could not start for a reason the person launching it can fix (a model folder that does
not load, an engine that does not start, Ray refused): one line on stderr, the tracebacks in a log file."""


def _config_error(message: str) -> NoReturn:
    print(f"vlmrl: config error: {message}", file=sys.stderr, flush=True)
    sys.exit(CONFIG_ERROR_EXIT)


STARTUP_LOG = "startup_error.log"
"""The file (in ``trainer.default_local_dir``) that holds the tracebacks of a run that could not start."""


def _write_log(folder: str, text: str) -> str:
    """Write ``text`` to ``folder``/startup_error.log, or to a new temporary file when that cannot be written; returns
    the path (when neither can be written: prints ``text`` to stderr and returns "above")."""
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.abspath(os.path.join(folder, STARTUP_LOG))
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    except OSError:
        pass
    try:
        fd, path = tempfile.mkstemp(prefix="vlmrl-startup-error-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    except OSError:  # nowhere to write: the tracebacks go to stderr before the line
        print(text, file=sys.stderr)
        return "above"


def _startup_error(e: StartupError, cfg: Any) -> NoReturn:
    """A run that could not start (``vlmrl.startup``): the tracebacks to a log file, one line naming what failed,
    the cause, what to check and the log (exit status 2). The trainer ended what it had started."""
    import datetime
    import traceback

    failure = e.failure
    driver = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    whose = "The worker's" if failure.what.startswith("worker ") else "The failing step's"
    text = (
        f"vlmrl: the run could not start ({datetime.datetime.now().isoformat(timespec='seconds')})\n{failure.line()}"
        f"\n\nThe driver's traceback:\n{driver}"
        + (f"\n{whose} traceback:\n{failure.details}" if failure.details else "")
    )
    log = _write_log(str(cfg.trainer.default_local_dir), text)
    print(f"vlmrl: start-up failed: {failure.line()} (traceback: {log})", file=sys.stderr, flush=True)
    sys.exit(STARTUP_ERROR_EXIT)


def _train(cfg: Any, plan: Any, clock: Any) -> None:
    """Train on a checked config and the plan the gate derived from it; start-up failures and stopped runs end the
    process with one line."""
    if plan.launcher == "local" and plan.device == "cpu":  # the workers' imports run meanwhile
        from vlmrl.workers.launch_local import start_forkserver

        start_forkserver(vllm=cfg.actor_rollout_ref.rollout.name == "vllm")
    from vlmrl.trainer.grpo import RunStopped, fit

    clock.mark("imports")
    try:
        os.remove(os.path.join(cfg.trainer.default_local_dir, STARTUP_LOG))  # an earlier start's
    except OSError:
        pass
    try:
        last = fit(cfg, checked=True, clock=clock, plan=plan)
    except ConfigError as e:
        _config_error(str(e))
    except RunStopped as e:
        print(f"vlmrl: run stopped at {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except StartupError as e:
        _startup_error(e, cfg)
    keys = [k for k in ("reward/mean", "val/reward/mean", "timing/step_s") if k in last]
    print("[vlmrl] done: " + ", ".join(f"{k}={last[k]:.4f}" for k in keys), flush=True)


def _start_workers_imports(raw: Any) -> None:
    """As soon as Hydra composed a training run's config: a run whose workers are this machine's CPU processes
    (``config.plan.surely_local_cpu``) starts their forkserver now, so its imports (torch, transformers, vLLM: ~20 s
    on one core, the start-up's longest path) run on the other core while this process imports torch for the config's
    checks (measured: the tiny quick start's start-up 23.6 / 27.5 -> 19.3 / 21.4 s). ``_train`` starts it where this
    could not tell; a run the checks then refuse ends it with this process."""
    from vlmrl.config.plan import surely_local_cpu

    if raw.trainer.dry_run or not surely_local_cpu(raw):
        return
    from vlmrl.workers.launch_local import start_forkserver

    start_forkserver(vllm=raw.actor_rollout_ref.rollout.name == "vllm")


def main(argv: list[str] | None = None) -> None:
    """Compose the command line into a checked config, then print it, dry-run it or train."""
    from vlmrl.timing import StartupClock

    clock = StartupClock(from_process_start=argv is None)  # from the command line: the interpreter's start counts
    if argv is None:  # the command line's process (python -m vlmrl.train, vlmrl-train)
        from vlmrl.procs import lean_exit

        lean_exit()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = parse(sys.argv[1:] if argv is None else argv)
    if cmd.help:
        print(USAGE)
        return
    early = None if cmd.print_config else _start_workers_imports
    composed = compose(cmd, machine=not cmd.print_config, composed=early)
    clock.mark("config")
    for note in composed.notices:
        print(f"[vlmrl] note: {note}", file=sys.stderr, flush=True)
    if composed.dry_run:
        from vlmrl import dry_run

        sys.exit(dry_run.run(composed.cfg, composed.problems, [], composed.plan))
    if composed.problems or composed.cfg is None:
        _config_error("\n".join(composed.problems))
    if cmd.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(composed.raw), end="")
        return
    _train(composed.cfg, composed.plan, clock)


if __name__ == "__main__":
    main()
