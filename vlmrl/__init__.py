"""vlmrl: reinforcement learning for vision-language models (Qwen2.5-VL) with vLLM rollouts and an FSDP2 trainer.

Modules import what they use at their top, within the layers of ``[tool.importlinter]`` in pyproject.toml
(tests/test_layers.py: the contract holds, no import cycle). Imports that wait inside a function do so for:

* start-up: importing ``vlmrl.config`` loads no torch (0.2 s), so the command line composes the config first; torch
  loads when a check needs the algorithm registries (``config.checks.algorithm_problems``,
  ``config.plan.needs_of``) and the driver imports the trainer after starting its workers' forkserver (``train``);
* the worker's environment: a worker process sets threads and its visible GPU before torch loads
  (``workers.launch_local`` and ``workers.launch_ray`` import ``workers.hybrid`` in the worker);
* optional dependencies, loaded only when used: vLLM (``rollout.vllm``; the HF rollout, ``rollout.hf``, where it
  replaces it), peft (``workers.lora``), Ray, wandb.
"""

from __future__ import annotations

from pathlib import Path

import vlmrl.configs

__version__ = "0.1.0"


def configs_dir() -> Path:
    """Folder of the packaged Hydra configs (``configs/`` in a checkout)."""
    return Path(vlmrl.configs.__file__).resolve().parent
