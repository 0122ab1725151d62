"""The worker group a config asks for: local processes, one inline worker, or Ray actors."""

from __future__ import annotations

from vlmrl.config import VLMRLConfig
from vlmrl.config.plan import WorkerPlan
from vlmrl.workers.group import WorkerGroup
from vlmrl.workers.launch_local import InlineWorkerGroup, ProcessWorkerGroup
from vlmrl.workers.launch_ray import RayWorkerGroup


def make_worker_group(cfg: VLMRLConfig, plan: WorkerPlan, first_gpu: int = 0) -> WorkerGroup:
    """The worker group the plan names (``plan.launcher``: the gate's ``RunPlan.launcher``); every worker is told
    ``plan`` (its ``role`` says which pool: hybrid, actor or rollout). ``first_gpu``: a second pool on this machine
    takes the GPUs after the first's."""
    kind = plan.launcher
    if kind == "ray":
        return RayWorkerGroup(cfg, plan)
    if kind == "inline":
        return InlineWorkerGroup(cfg, plan)
    return ProcessWorkerGroup(cfg, plan, first_gpu=first_gpu)
