"""vlmrl: reinforcement learning for vision-language models (Qwen2.5-VL) with vLLM rollouts and an FSDP2 trainer."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def configs_dir() -> Path:
    """Folder of the packaged Hydra configs (``configs/`` in a checkout)."""
    import vlmrl.configs

    return Path(vlmrl.configs.__file__).resolve().parent
