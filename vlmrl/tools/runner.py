"""Running tool calls: in worker processes where ``tool_timeout_s`` can stop them (the default), or in the caller.

``multi_turn.tool_workers = N >= 1`` (default 2): the tools are built once in each of N worker processes
(:class:`vlmrl.supervise.SupervisedPool`); each call (``create`` -> ``execute`` -> ``release``) is one task. A call
still running after ``tool_timeout_s`` (a blocking read, sympy grading ``9^{9^{9}}`` while holding the GIL) ends its
worker, which the pool replaces: nothing of it keeps running. N calls run at a time; a rollout whose calls keep
timing out costs about one timeout per worker, and one whose first 2 x N calls all timed out stops the run
(:class:`vlmrl.supervise.HangError`). State a tool keeps in ``self`` between calls lives in a worker and is lost
with it.

``tool_workers = 0``: calls run one after another in the rollout worker's own thread (a debugger works); nothing can
stop a call there, so ``tool_timeout_s`` must be 0 (the config check says so).

With a tensor-parallel engine (``rollout.tensor_model_parallel_size > 1``) the ranks sharing it must continue from the
same tool turns: the group's first rank runs the calls and the others receive its outcomes (:class:`ToolGroup`), so
a timeout on one rank, or a tool whose answer varies, cannot set them apart.

Either way what a call gives back is checked in the process that ran it (:func:`run_call`) and crosses as plain
data (:class:`ToolOutcome`): a text, PIL images, a number.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from vlmrl.models.qwen_vl import resized_size
from vlmrl.supervise import DIED, TIMEOUT, HangError, HangWatch, SupervisedPool
from vlmrl.timing import Timer
from vlmrl.tools.base import BaseTool
from vlmrl.tools.config import ToolConfigError, build_tools

MAX_MESSAGE = 2000
"""Characters of an error message kept (a tool that raises with 20 MB of text costs nothing more)."""

AGENT_KWARGS = ("image", "source_image", "image_bounds")
"""What the agent gives ``create`` itself; a record's ``create_kwargs`` cannot replace them."""


@dataclass
class ToolRequest:
    """One call: the tool, the policy's arguments and what ``create`` gets."""

    name: str
    arguments: dict[str, Any]
    create_kwargs: dict[str, Any] = field(default_factory=dict)
    """The record's ``extra_info.tools_kwargs[name].create_kwargs`` (data), without :data:`AGENT_KWARGS`."""
    image: Image.Image | None = None
    source_image: Image.Image | None = None
    image_bounds: tuple[int, int, int] | None = None
    ground_truth: Any = None


@dataclass
class ToolOutcome:
    """A call's checked result: text, images and step reward, or an error kind and message."""

    text: str = ""
    images: list[Image.Image] = field(default_factory=list)
    reward: float = 0.0
    error: str | None = None
    """None, or exception | bad_result | timeout (the kinds ``ToolCallRecord.error`` starts with)."""
    message: str = ""
    seconds: float = 0.0


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f"...({len(text)} characters)"


def _failure(kind: str, message: str) -> ToolOutcome:
    return ToolOutcome(error=kind, message=_short(message))


async def _invoke(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a tool method, awaiting what it returns when that is awaitable."""
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


async def _call(tool: BaseTool, req: ToolRequest) -> Any:
    create_kwargs = {k: v for k, v in req.create_kwargs.items() if k not in AGENT_KWARGS}
    iid = None
    try:
        created = await _invoke(
            tool.create,
            create_kwargs=create_kwargs,
            image=req.image,
            source_image=req.source_image,
            image_bounds=req.image_bounds,
            ground_truth=req.ground_truth,
        )
        iid = created[0] if isinstance(created, tuple) else created
        return await _invoke(tool.execute, iid, dict(req.arguments))
    finally:
        if iid is not None:
            try:
                await _invoke(tool.release, iid)
            except Exception:  # noqa: BLE001 - a failing release does not change what the policy read
                pass


def check_result(result: Any) -> ToolOutcome:
    """The outcome of what ``execute`` returned: ``(response, reward, metrics)`` with text a string, images a list
    of PIL images and a finite reward, else a ``bad_result`` saying what is wrong."""
    if not (isinstance(result, tuple) and len(result) == 3):
        return _failure("bad_result", "the tool returned something other than (response, reward, metrics)")
    response, reward, _metrics = result
    text = getattr(response, "text", None)
    images = getattr(response, "image", None) or []
    if text is not None and not isinstance(text, str):
        return _failure("bad_result", f"response text is a {type(text).__name__}, not a string")
    if not isinstance(images, list) or not all(isinstance(im, Image.Image) for im in images):
        return _failure("bad_result", "response images must be a list of PIL images")
    try:
        reward = 0.0 if reward is None else float(reward)
    except (TypeError, ValueError, OverflowError):
        return _failure("bad_result", f"step reward {_short(repr(reward))} is not a number")
    if not math.isfinite(reward):
        return _failure("bad_result", f"step reward {reward!r} is not finite")
    return ToolOutcome(text=text or "", images=list(images), reward=reward)


def run_call(tool: BaseTool, req: ToolRequest) -> ToolOutcome:
    """Run one call to completion in this thread (create, execute, release) and check what it gave; whatever the
    tool raises becomes an ``exception`` outcome."""
    sw = Timer.start()
    try:
        out = check_result(asyncio.run(_call(tool, req)))
    except BaseException as e:  # noqa: BLE001 - whatever a tool does (sys.exit included), the policy reads an error
        out = _failure("exception", f"{type(e).__name__}: {e}")
    out.seconds = sw.elapsed
    return out


# ------------------------------------------------------------------------------------------------ worker side

_TOOLS: dict[str, BaseTool] = {}
_BUILD_ERROR: str | None = None


def _build_tools(path: str) -> None:
    """Worker start-up (before any call's timeout starts): the tools, built once, and what the built-ins import
    when called (``vlmrl.models.qwen_vl``'s image sizes: torch and qwen-vl-utils, seconds to import)."""
    global _TOOLS, _BUILD_ERROR
    try:
        resized_size(28, 28, 28, 784, 3136)  # qwen-vl-utils' first call (a forkserver without it imports it here)
        _TOOLS = build_tools(path)
    except BaseException as e:  # noqa: BLE001 - reported with the first call
        _BUILD_ERROR = f"{type(e).__name__}: {e}"


def _run(req: ToolRequest) -> ToolOutcome:
    if _BUILD_ERROR is not None:
        return _failure("build_error", _BUILD_ERROR)
    return run_call(_TOOLS[req.name], req)


@dataclass
class ToolGroup:
    """The ranks of one tensor-parallel engine (a ``torch.distributed`` group that can carry objects: gloo): the
    ``leader`` (its first rank, a global rank) runs each turn's calls, every rank gets the same outcomes, or the same
    error (a tool that hangs stops every rank of the engine, not only the one that ran it)."""

    group: Any
    leader: int
    is_leader: bool

    def share(self, compute: Callable[[], list[ToolOutcome]]) -> list[ToolOutcome]:
        """The leader's ``compute()``, on every rank of the group."""
        import torch.distributed as dist

        box: list[Any] = [None]
        error: BaseException | None = None
        if self.is_leader:
            try:
                box[0] = ("ok", compute())
            except Exception as e:  # noqa: BLE001 - the other ranks raise it too
                error = e
                sent = e if isinstance(e, (HangError, ToolConfigError)) else RuntimeError(f"{type(e).__name__}: {e}")
                box[0] = ("error", sent)
        dist.broadcast_object_list(box, src=self.leader, group=self.group)
        kind, value = box[0]
        if kind == "error":
            raise error or value
        return value


class ToolRunner:
    """The tools of a tool config file, and where their calls run."""

    def __init__(
        self, tool_config_path: str | None, num_workers: int, timeout_s: float, group: ToolGroup | None = None
    ) -> None:
        """Builds the tools here (so a bad config fails at start-up) and, with ``num_workers >= 1``, in each worker.
        No path: no tools (every call is an unknown tool). ``group``: a tensor-parallel engine's ranks, of which only
        the leader runs calls (and starts workers)."""
        self.tools = build_tools(tool_config_path) if tool_config_path else {}
        self.timeout_s = float(timeout_s)
        self.group = group
        self.pool: SupervisedPool | None = None
        if group is not None and not group.is_leader:
            num_workers = 0  # this rank receives the leader's outcomes
        if num_workers > 0 and self.tools:
            what = "tool calls (" + ", ".join(sorted(self.tools)) + ")"
            setting = "actor_rollout_ref.rollout.multi_turn.tool_timeout_s"
            self.pool = SupervisedPool(
                what,
                setting,
                num_workers,
                timeout_s,
                initializer=_build_tools,
                initargs=(str(tool_config_path),),
                preload=["vlmrl.tools.runner", "vlmrl.models.qwen_vl", "qwen_vl_utils.vision_process"],
            )
            self.pool.warm()  # now, not at the first call: the built-ins' imports take seconds

    @property
    def names(self) -> list[str]:
        """The tools' names, as the policy calls them."""
        return sorted(self.tools)

    def new_watch(self) -> HangWatch | None:
        """The timeout policy of one rollout, shared by its turns' :meth:`run` (None without worker processes)."""
        return self.pool.new_watch() if self.pool is not None else None

    def run(self, requests: list[ToolRequest], watch: HangWatch | None = None) -> list[ToolOutcome]:
        """Every request's outcome, in order. Raises :class:`vlmrl.supervise.HangError` when the calls keep timing
        out (see the module docstring); ``watch`` (:meth:`new_watch`) counts them across a rollout's turns. In a
        :class:`ToolGroup`, every rank calls it with the same requests and gets the leader's outcomes."""
        if self.group is not None:
            return self.group.share(lambda: self._run_here(requests, watch))
        return self._run_here(requests, watch)

    def _run_here(self, requests: list[ToolRequest], watch: HangWatch | None) -> list[ToolOutcome]:
        if self.pool is None:
            return [run_call(self.tools[r.name], r) for r in requests]
        results = self.pool.map(_run, [(r,) for r in requests], names=[r.name for r in requests], watch=watch)
        out = []
        for req, res in zip(requests, results):
            if res.error == TIMEOUT:
                out.append(ToolOutcome(error="timeout", message=f"{req.name} {res.message}", seconds=res.seconds))
            elif res.error == DIED:
                out.append(ToolOutcome(error="exception", message=f"{req.name}: {res.message}", seconds=res.seconds))
            elif res.error is not None:  # arguments or a result that could not cross processes
                out.append(ToolOutcome(error="exception", message=_short(res.message), seconds=res.seconds))
            elif res.value.error == "build_error":
                raise ToolConfigError(f"a tool worker could not build the tools: {res.value.message}")
            else:
                out.append(res.value)
        return out

    def close(self) -> None:
        """Stop the worker processes."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
