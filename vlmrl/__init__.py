"""vlmrl: reinforcement learning for vision-language models (Qwen2.5-VL) with vLLM rollouts and an FSDP2 trainer.

Modules import what they use at their top. The few imports of vlmrl inside functions wait on purpose, and only these:

* torch stays out of the config gate and the command line until a run starts, so a bad config is answered in a
  second: ``config.checks`` (``models.qwen_vl``'s model types, ``algos.core``'s estimators and losses), ``train``
  (``trainer.grpo``, ``dry_run``);
* a worker process sets its environment (threads, visible GPU) before torch loads: ``workers.launch_local`` and
  ``workers.launch_ray`` import ``workers.hybrid`` in the worker; ``workers.group`` imports the launchers it picks
  (Ray only when it is the launcher; the launchers import ``workers.group`` themselves);
* optional dependencies load only when used: vLLM (``workers.hybrid`` and ``dry_run``: ``rollout.vllm``; the HF
  rollout, ``rollout.hf``, where it replaces it) and peft (``workers.policy`` and ``export``: ``workers.lora``).
"""

from __future__ import annotations

from pathlib import Path

import vlmrl.configs

__version__ = "0.1.0"


def configs_dir() -> Path:
    """Folder of the packaged Hydra configs (``configs/`` in a checkout)."""
    return Path(vlmrl.configs.__file__).resolve().parent
