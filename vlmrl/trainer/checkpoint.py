"""Checkpoints: layout, atomic commit, retention and discovery (driver side).

    <trainer.default_local_dir>/
      latest_checkpointed_iteration.txt      the newest complete step (verl's tracker file), replaced atomically
      global_step_<N>/
        actor/                               sharded model + optimizer (torch.distributed.checkpoint, every rank)
        actor/extra_rank<R>.json             scheduler and RNG states of rank R (JSON: nothing is unpickled)
        trainer_state.json                   step, data sampler position, driver RNG
        config.yaml                          the run's resolved config (export reads the model path and LoRA here)

A checkpoint is written into ``global_step_<N>.tmp`` and renamed to ``global_step_<N>`` only when every part is on
disk, so a crash mid-save leaves at most a ``.tmp`` folder that resume ignores (and removes).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

TRACKER_FILE = "latest_checkpointed_iteration.txt"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the path and the OS error."""


_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """The final folder of the checkpoint of ``step``."""
    return Path(root) / f"global_step_{step}"


def tmp_dir(root: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is committed."""
    return Path(root) / f"global_step_{step}.tmp"


def is_complete(path: str | os.PathLike) -> bool:
    """A committed checkpoint folder: its trainer state and the actor's shard metadata are there."""
    p = Path(path)
    return (p / "trainer_state.json").is_file() and (p / "actor" / ".metadata").is_file()


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, folder), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and is_complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def find_resume(root: str | os.PathLike) -> Path | None:
    """The checkpoint ``resume_mode=auto`` continues from: the tracker file's step when that folder is complete,
    else the newest complete folder; None when there is none."""
    root = Path(root)
    tracker = root / TRACKER_FILE
    if tracker.is_file():
        try:
            p = step_dir(root, int(tracker.read_text().strip()))
            if is_complete(p):
                return p
        except ValueError:
            pass
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def remove_partial(root: str | os.PathLike) -> list[Path]:
    """Delete ``global_step_*.tmp`` folders left by an interrupted save; returns what was removed."""
    root = Path(root)
    gone = []
    if root.is_dir():
        for p in root.glob("global_step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def commit(root: str | os.PathLike, step: int, keep: int | None) -> Path:
    """Rename the finished ``.tmp`` folder into place, point the tracker file at it, apply retention."""
    root = Path(root)
    src, dst = tmp_dir(root, step), step_dir(root, step)
    if not is_complete(src):
        raise RuntimeError(f"checkpoint {src} is incomplete (missing trainer_state.json or actor/.metadata)")
    if dst.exists():  # a re-save of the same step (e.g. after resuming from an older one)
        old = dst.with_name(dst.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        dst.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    src.rename(dst)
    _atomic_write(root / TRACKER_FILE, str(step))
    if keep is not None and keep > 0:  # the one just written always stays, with the newest keep-1 of the others
        others = [p for _, p in list_checkpoints(root) if p != dst]
        for p in others[: max(0, len(others) - (keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
    return dst


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_trainer_state(folder: str | os.PathLike, state: dict[str, Any], config_yaml: str) -> None:
    """The driver's part of a checkpoint (inside the ``.tmp`` folder)."""
    folder = Path(folder)
    (folder / "config.yaml").write_text(config_yaml, encoding="utf-8")
    _atomic_write(folder / "trainer_state.json", json.dumps(state, indent=1))


def read_trainer_state(folder: str | os.PathLike) -> dict[str, Any]:
    """The driver's part of a checkpoint."""
    return json.loads((Path(folder) / "trainer_state.json").read_text(encoding="utf-8"))


def restored_kl(saved: Any, kind: str, kl_coef: float, where: str) -> tuple[float | None, str | None]:
    """What a resumed run's in-reward KL coefficient starts at, and a notice when the command line and the
    checkpoint differ. A fixed coefficient is the config's (as in verl, which saves none); an adaptive one is the
    checkpoint's adapted value unless the config's type or starting ``kl_coef`` changed since it was saved (then the
    config's). ``None``: start at the config's value. A saved value that is not a finite number >= 0 is refused."""
    if not isinstance(saved, dict) or "value" not in saved:
        return None, None
    value = saved["value"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CheckpointError(
            f"{where}: kl_ctrl.value={value!r} is not a finite number >= 0 (a damaged or edited file)"
        )
    if kind != "adaptive":
        note = None
        if float(value) != float(kl_coef):
            note = f"algorithm.kl_ctrl.kl_coef={kl_coef:g} (the config's; the checkpoint's fixed value was {value:g})"
        return None, note
    if saved.get("kind", kind) != kind or float(saved.get("kl_coef", kl_coef)) != float(kl_coef):
        return (
            None,
            f"algorithm.kl_ctrl.kl_coef={kl_coef:g} (set anew; the checkpoint's adapted value {value:g} dropped)",
        )
    return float(value), None


def restored_algorithm_state(
    state: dict[str, Any], saved_params: Any, params: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The algorithm class's state to restore, and a notice per parameter the command line changed: a constructor
    parameter whose configured value differs from the one the checkpoint's run was given is the config's (the user
    just set it); the rest of the class's state is the checkpoint's."""
    state, notes = dict(state), []
    if not isinstance(saved_params, dict):
        return state, notes
    for key, value in params.items():
        if key in state and saved_params.get(key) != value and state[key] != value:
            notes.append(f"algorithm.{key}={value!r} (the config's; the checkpoint had {state[key]!r})")
            state[key] = value
    return state, notes
