"""A process's random-number state (Python, NumPy, torch CPU and CUDA) as plain JSON data, for exact resume.

JSON, not a pickle: a checkpoint's RNG state is read back without running anything stored in it.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def _bytes(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def state() -> dict[str, Any]:
    """This process's RNG states, JSON-serialisable."""
    py = random.getstate()
    st = np.random.get_state()
    out: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [st[0], st[1].tolist(), int(st[2]), int(st[3]), float(st[4])],
        "torch": _bytes(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return out


def restore(data: dict[str, Any]) -> None:
    """Restore what ``state`` returned (ValueError naming the part that is malformed)."""
    try:
        py = data["python"]
        random.setstate((int(py[0]), tuple(int(x) for x in py[1]), py[2]))
        n = data["numpy"]
        np.random.set_state((str(n[0]), np.asarray(n[1], dtype=np.uint32), int(n[2]), int(n[3]), float(n[4])))
        if "torch" in data:
            torch.set_rng_state(_tensor(data["torch"]))
        if "cuda" in data and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_tensor(s) for s in data["cuda"]])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
        raise ValueError(f"malformed RNG state ({type(e).__name__}: {e})") from None
