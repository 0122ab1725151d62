"""Weight sync between the pools of ``actor_rollout_ref.hybrid_engine=False`` (the one-step off-policy trainer).

A ``torch.distributed`` process group of its own spans the training pool's rank 0 (sync rank 0, the sender) and
every rollout worker (sync ranks 1..R): gloo on CPU, NCCL on GPU, met through a file (one machine, a private
temporary folder) or a TCP store on the training pool's first node (a Ray cluster). It lives beside each pool's own
default group, which stays as in the hybrid engine.

Each sync: every training rank walks ``PolicyWorker.engine_weights()`` (the FSDP2 units are gathered once, LoRA
merged: the same full tensors under the same names as the hybrid push); rank 0 packs them, in that order, into
buckets of ``BUCKET_BYTES`` (one dtype each) and broadcasts each bucket; the rollout workers cut the same buckets from
the tensor list (``WeightMeta``) they were told when the group formed, and stream the tensors into their engines
without a restart.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlmrl.workers.rendezvous import make_store

BUCKET_BYTES = 256 * 2**20
"""Largest bucket broadcast at once (a tensor larger than it goes alone)."""


@dataclass(frozen=True)
class WeightMeta:
    """One tensor of a sync, in the order it is sent."""

    name: str
    """The engine's name of the tensor (``qwen_vl.engine_weight_name``)."""
    shape: tuple[int, ...]
    dtype: str
    """``str(torch.dtype)`` without the prefix, e.g. float32."""

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def buckets(meta: list[WeightMeta], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices of ``meta`` grouped into consecutive buckets of one dtype each and at most ``limit`` bytes (a larger
    tensor is a bucket alone); sender and receivers cut the same buckets from the same list."""
    out: list[list[int]] = []
    size, dtype = 0, None
    for i, m in enumerate(meta):
        if out and m.dtype == dtype and size + m.nbytes <= limit:
            out[-1].append(i)
            size += m.nbytes
        else:
            out.append([i])
            size, dtype = m.nbytes, m.dtype
    return out


def meta_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[WeightMeta]:
    """The ``WeightMeta`` of (name, tensor) pairs."""
    return [WeightMeta(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]


class WeightSync:
    """One member of the sync group. ``init``: ``file://PATH`` or ``tcp://HOST:PORT?auth=SECRET`` (the sender hosts
    the store behind ``vlmrl.workers.rendezvous``'s gate); rank 0 sends, the others receive."""

    def __init__(self, init: str, rank: int, world: int, device: str, meta: list[WeightMeta], timeout_s: float) -> None:
        """Join the group (every member must, at about the same time: it is a rendezvous)."""
        self.rank, self.world, self.device, self.meta = rank, world, device, list(meta)
        timeout = datetime.timedelta(seconds=timeout_s)
        self._rendezvous = make_store(init, rank, world, timeout)  # (tcp: gated, on the sender's interface)
        store = dist.PrefixStore("vlmrl-weight-sync", self._rendezvous.store)
        if device == "cuda":
            self.group: dist.ProcessGroup = dist.ProcessGroupNCCL(store, rank, world)
        else:  # (on one machine the local launcher's workers bind gloo to loopback: GLOO_SOCKET_IFNAME=lo)
            self.group = dist.ProcessGroupGloo(store, rank, world, timeout)
        self._buckets = buckets(self.meta)
        self.broadcast_s = 0.0
        """Seconds the last ``send`` spent broadcasting (the collective alone: the link's bandwidth)."""

    def _broadcast(self, flat: torch.Tensor) -> None:
        t0 = time.perf_counter()
        self.group.broadcast([flat]).wait()
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.broadcast_s += time.perf_counter() - t0

    def send(self, named: Iterator[tuple[str, torch.Tensor]]) -> int:
        """Rank 0: broadcast the tensors of ``named`` (which must follow ``meta``: names, shapes, dtypes), bucket by
        bucket; returns the bytes sent (``broadcast_s``: the seconds spent in the broadcasts themselves)."""
        sent, want = 0, iter(self.meta)
        self.broadcast_s = 0.0
        bucket: list[torch.Tensor] = []
        ends = {b[-1] for b in self._buckets}
        for i, (name, t) in enumerate(named):
            m = next(want, None)
            if m is None or (m.name, m.shape, m.dtype) != (name, tuple(t.shape), str(t.dtype).removeprefix("torch.")):
                raise RuntimeError(
                    f"weight sync: tensor {i} is {name} {tuple(t.shape)} {t.dtype}, the rollout workers expect "
                    f"{m.name + ' ' + str(m.shape) + ' ' + m.dtype if m else 'no more tensors'}"
                )
            bucket.append(t.detach().reshape(-1))
            if i in ends:
                flat = torch.cat(bucket) if len(bucket) > 1 else bucket[0].contiguous()
                self._broadcast(flat.to(self.device) if self.device == "cuda" else flat)
                sent += flat.numel() * flat.element_size()
                bucket = []
        if next(want, None) is not None:
            raise RuntimeError("weight sync: the policy yielded fewer tensors than the rollout workers expect")
        return sent

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..: (name, tensor) for every tensor of ``meta``, bucket by bucket as they arrive (each bucket a
        fresh buffer: an engine may keep tensors until its reload ends)."""
        dev = "cuda" if self.device == "cuda" else "cpu"
        for b in self._buckets:
            ms = [self.meta[i] for i in b]
            numel = [int(torch.Size(m.shape).numel()) for m in ms]
            flat = torch.empty(sum(numel), dtype=getattr(torch, ms[0].dtype), device=dev)
            self._broadcast(flat)
            for m, part in zip(ms, flat.split(numel)):
                yield m.name, part.view(m.shape)

    def close(self) -> None:
        """Release the group."""
        shutdown = getattr(self.group, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001 - a peer may be gone already
                pass
        self._rendezvous.close()
