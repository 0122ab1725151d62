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


def _train(cfg: Any) -> None:
    """Train on a checked config; start-up failures and stopped runs end the process with one line."""
    from vlmrl.config import ConfigError
    from vlmrl.trainer.grpo import RunStopped, fit

    try:
        os.remove(os.path.join(cfg.trainer.default_local_dir, STARTUP_LOG))  # an earlier start's
    except OSError:
        pass
    try:
        last = fit(cfg)
    except ConfigError as e:
        _config_error(str(e))
    except RunStopped as e:
        print(f"vlmrl: run stopped at {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Exception as e:
        if _starting(e) is None:
            raise  # a failure while training that RunStopped does not cover: the traceback, as before
        _startup_error(e, cfg)
    keys = [k for k in ("reward/mean", "val/reward/mean", "timing/step_s") if k in last]
    print("[vlmrl] done: " + ", ".join(f"{k}={last[k]:.4f}" for k in keys), flush=True)


def main(argv: list[str] | None = None) -> None:
    """Compose the command line into a checked config, then print it, dry-run it or train."""
    from vlmrl.config.command import USAGE, compose, parse

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = parse(sys.argv[1:] if argv is None else argv)
    if cmd.help:
        print(USAGE)
        return
    composed = compose(cmd)
    for note in composed.notices:
        print(f"[vlmrl] note: {note}", file=sys.stderr, flush=True)
    if composed.dry_run:
        from vlmrl import dry_run

        sys.exit(dry_run.run(composed.cfg, composed.problems, []))
    if composed.problems or composed.cfg is None:
        _config_error("\n".join(composed.problems))
    if cmd.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(composed.raw), end="")
        return
    _train(composed.cfg)


if __name__ == "__main__":
    main()
