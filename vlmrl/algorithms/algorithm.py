"""An algorithm of your own as one class (``algorithm.name``), with step hooks; the trainer's loop stays as it is.

``algorithm.name`` names the class: ``module.Class`` (importable from the working directory: a file beside your
script) or ``path/to/file.py:Class``. The other keys under ``algorithm`` that the schema does not know are its
constructor's keyword arguments (``+algorithm.min_length=30`` on the command line or ``min_length: 30`` in a config
file's ``algorithm`` block). Where the hooks run:

1. ``before_train_step(step, data)``, in the driver, after the rewards and before the advantages. ``data``:
   ``rewards`` [B] float tensor (each sample's score: what you change here is what the advantages are computed
   from), ``group`` [B] (prompt index), the batch's tensors as ``compute_loss`` names them (``responses`` [B, R],
   ``response_mask`` [B, R], ``attention_mask`` [B, P+R], ``response_lengths`` [B]; also ``prompts`` [B, P],
   left-padded), ``texts`` (decoded responses), ``components`` (reward components: name -> list of floats).
2. ``compute_loss(data) -> dict``, on every worker for every micro-batch (under FSDP). ``data`` holds [b, R]
   tensors: ``responses``, ``response_mask`` (1 on generated tokens), ``attention_mask`` ([b, P+R]),
   ``old_log_probs``, ``log_probs`` (with gradient), ``ref_log_probs`` (None without a reference), ``advantages``,
   ``entropy``, ``rollout_is_weights`` (None without rollout correction), ``rewards`` (each sample's score, as
   the advantages saw it, on its last generated token), ``response_lengths`` [b]. Return
   ``{"loss": scalar tensor with gradient, **metrics}``; the metrics are logged under ``actor/``. The default is
   the configured policy loss (``actor.policy_loss.loss_mode``) with the entropy bonus and the KL loss, so a
   subclass can call ``super().compute_loss(data)`` and add to ``out["loss"]``.
3. ``after_train_step(step, metrics)``, in the driver, with the step's metrics.
4. ``get_metrics() -> dict``, in the driver after each step: logged under ``algorithm/``.

The instance's public attributes are its state (``state_dict``): what ``before_train_step`` sets is sent to every
worker with the step's data (so ``compute_loss`` sees it in the same step), and it is saved in checkpoints (exact
resume). Keep them plain data (numbers, strings, lists, dicts). A hook that raises, or a loss that is not a finite
scalar with a gradient, stops the run naming the class, the hook and the step; checkpoints already written stay.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import sys
import threading
from typing import Any

import torch

from vlmrl.algorithms.core import kl_penalty
from vlmrl.algorithms.losses import LossConfig, agg_loss, get_policy_loss
from vlmrl.userfiles import load_callable


class AlgorithmError(RuntimeError):
    """A user's algorithm class failed: the message names the class, the hook and the step."""


class RLAlgorithm:
    """Base class of ``algorithm.name`` classes; see the module docstring for the hooks and their data."""

    def __init__(self, **params: Any) -> None:
        for k, v in params.items():
            setattr(self, k, v)

    # the trainer sets these before any hook runs (the worker-side ones before compute_loss)
    loss_config: LossConfig | None = None
    """The actor's loss settings (``actor_rollout_ref.actor``), verl's attribute names."""

    def before_train_step(self, step: int, data: dict[str, Any]) -> None:
        """After the rewards, before the advantages (driver): change ``data["rewards"]`` in place to reshape them."""

    def compute_loss(self, data: dict[str, Any]) -> dict[str, Any]:
        """The configured policy loss plus the entropy bonus and the KL loss (per micro-batch, on every worker)."""
        cfg = self.loss_config if self.loss_config is not None else LossConfig()
        info = cfg.global_batch_info
        mask = data["response_mask"]
        fn = get_policy_loss(cfg.policy_loss.loss_mode)
        loss, metrics = fn(
            old_log_prob=data["old_log_probs"],
            log_prob=data["log_probs"],
            advantages=data["advantages"],
            response_mask=mask,
            loss_agg_mode=cfg.loss_agg_mode,
            config=cfg,
            rollout_is_weights=data.get("rollout_is_weights"),
        )
        out: dict[str, Any] = {"pg_loss": loss, **{k.removeprefix("actor/"): v for k, v in metrics.items()}}
        # (names with a '/' left, e.g. bypass mode's rollout_corr/*, are logged as they are; the others under actor/)
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * agg_loss(data["entropy"], mask, cfg.loss_agg_mode, **info)
        if data.get("ref_log_probs") is not None:
            kl = kl_penalty(data["log_probs"], data["ref_log_probs"], cfg.kl_loss_type)
            out["kl_loss"] = agg_loss(kl, mask, cfg.loss_agg_mode, **info)
            loss = loss + cfg.kl_loss_coef * out["kl_loss"]
        out["loss"] = loss
        return out

    def after_train_step(self, step: int, metrics: dict[str, float]) -> None:
        """After the update (driver), with the step's metrics."""

    def get_metrics(self) -> dict[str, float]:
        """Numbers to log under ``algorithm/`` after each step (driver)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The public attributes that are plain data (JSON): sent to the workers each step and checkpointed."""
        out = {}
        for k, v in vars(self).items():
            if k.startswith("_") or k == "loss_config":
                continue
            try:
                json.dumps(v)
            except (TypeError, ValueError, RecursionError):  # not plain data (or nested too deep to be): not state
                continue
            out[k] = v
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set the attributes ``state_dict`` returned."""
        for k, v in state.items():
            setattr(self, k, v)


def load_class(spec: str) -> type:
    """``module.Class`` (the working directory first on the path) or ``path/to/file.py:Class``."""
    if ":" in spec:
        cls = load_callable(spec, what="algorithm.name")
    else:
        module, _, name = spec.rpartition(".")
        if not module:
            raise ValueError(f"algorithm.name={spec!r}: expected 'module.Class' or 'path/to/file.py:Class'")
        if "" not in sys.path:
            sys.path.insert(0, "")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"algorithm.name={spec!r}: cannot import {module!r} ({e}; a file beside "
                "your script, or path/to/file.py:Class)"
            ) from None
        cls = getattr(mod, name, None)
        if cls is None:
            raise AttributeError(f"algorithm.name={spec!r}: {module!r} has no {name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, RLAlgorithm)):
        raise TypeError(
            f"algorithm.name={spec!r}: {getattr(cls, '__name__', cls)!r} is not a subclass of "
            "vlmrl.algorithms.RLAlgorithm"
        )
    return cls


def build_algorithm(spec: str | None, params: dict[str, Any], loss_config: LossConfig | None = None) -> RLAlgorithm:
    """The instance ``algorithm.name`` with its parameters names (the base class when None)."""
    cls = load_class(spec) if spec else RLAlgorithm
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as e:
        raise TypeError(
            f"algorithm.name={spec!r}: its constructor does not take these parameters "
            f"({', '.join(params) or 'none'}): {e}"
        ) from None
    algo = cls(**params)
    algo.loss_config = loss_config
    return algo


def parameters(cls: type) -> dict[str, Any]:
    """A class's constructor parameters and their defaults (the dry run lists them)."""
    out = {}
    for name, p in inspect.signature(cls).parameters.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        out[name] = None if p.default is p.empty else p.default
    return out


def call_hook(algo: RLAlgorithm, hook: str, step: int, *args: Any, timeout_s: float | None = None) -> Any:
    """Run a hook; anything it raises (``SystemExit`` included) becomes an AlgorithmError naming the class, the hook
    and the step. ``timeout_s`` (the driver's hooks: ``trainer.worker_timeout_s``) bounds it: a hook still running
    then stops the run naming it (its thread is left behind; the run ends)."""
    name = f"algorithm {type(algo).__name__}.{hook}"
    if timeout_s is None:
        return _run_hook(algo, hook, step, args, name)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = _run_hook(algo, hook, step, args, name)
        except AlgorithmError as e:
            box["error"] = e

    thread = threading.Thread(target=run, name=f"vlmrl-{hook}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise AlgorithmError(
            f"{name} did not return within {timeout_s:g} s at step {step} (trainer.worker_timeout_s bounds the "
            "driver's hooks as it bounds the workers)"
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _run_hook(algo: RLAlgorithm, hook: str, step: int, args: tuple, name: str) -> Any:
    try:
        return getattr(algo, hook)(*args)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a user's code: anything it raises stops the run by name
        raise AlgorithmError(f"{name} failed at step {step}: {type(e).__name__}: {e}") from e


def check_gradient_path(algo: RLAlgorithm, out: dict[str, Any], data: dict[str, Any], step: int) -> None:
    """That the loss can train the policy (run on a worker's first micro-batch): the configured policy loss (for the
    built-in class) must depend on ``data["log_probs"]``, a class's own ``loss`` on the log-probs or the entropy. A
    loss with ``requires_grad`` but no path to them (a new leaf, a constant) would update nothing but the entropy
    bonus, with a gradient norm of 0."""
    if type(algo) is RLAlgorithm:
        loss_mode = (algo.loss_config or LossConfig()).policy_loss.loss_mode
        what, loss, inputs = f"the policy loss {loss_mode!r}", out.get("pg_loss"), [data["log_probs"]]
    else:
        what, loss = f"algorithm {type(algo).__name__}.compute_loss's 'loss'", out["loss"]
        inputs = [t for t in (data["log_probs"], data.get("entropy")) if isinstance(t, torch.Tensor)]
    inputs = [t for t in inputs if t.requires_grad]
    if not isinstance(loss, torch.Tensor) or not inputs:
        return
    reached = loss.requires_grad and any(
        g is not None for g in torch.autograd.grad(loss, inputs, retain_graph=True, allow_unused=True)
    )
    if not reached:
        raise AlgorithmError(
            f"{what} at step {step} does not depend on the policy's log-probs (data['log_probs'], the log_prob "
            "argument): no gradient would reach the model's parameters (a constant, a detached value or a new leaf "
            "tensor); compute it from them"
        )


def checked_loss(algo: RLAlgorithm, out: Any, step: int) -> tuple[torch.Tensor, dict[str, float]]:
    """``compute_loss``'s output checked: ``loss`` a finite scalar with a gradient; the other entries as floats."""
    name = f"algorithm {type(algo).__name__}.compute_loss at step {step}"
    if not isinstance(out, dict) or "loss" not in out:
        raise AlgorithmError(f"{name}: must return a dict with a 'loss' tensor, got {type(out).__name__}")
    loss = out["loss"]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise AlgorithmError(f"{name}: 'loss' must be a scalar tensor, got {type(loss).__name__}")
    if not loss.requires_grad:
        raise AlgorithmError(f"{name}: 'loss' has no gradient (computed from detached tensors?)")
    if type(algo) is not RLAlgorithm and not math.isfinite(float(loss.detach())):
        # (the built-in loss's non-finite values go on to the gradient check, which names them and the usual causes)
        raise AlgorithmError(f"{name}: 'loss' is not finite ({float(loss.detach())})")
    metrics = {}
    for k, v in out.items():
        if k == "loss":
            continue
        try:
            metrics[k] = float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
        except (TypeError, ValueError):
            continue
    return loss.reshape(()), metrics
