"""Shared fixtures: one cached tiny Qwen2.5-VL per seed, thread pinning, Ray/vLLM environment for tests."""

from __future__ import annotations

import os
import tempfile

# set before torch / vLLM / Ray are imported by any test module
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="vlmrl-ray-"))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session", autouse=True)
def shared_forkserver():
    """One forkserver for the whole session, preloaded as a rollout worker's is (its tool pool starts it): the reward
    and tool pools of many tests share this process, and Python starts one forkserver per process, with the preload
    of the first pool that asks."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    from vlmrl.supervise import PRELOAD

    mp.get_context("forkserver").set_forkserver_preload([*PRELOAD, "vlmrl.tools.runner", "vlmrl.models.qwen_vl",
                                                         "qwen_vl_utils.vision_process"])  # fmt: skip
    forkserver.ensure_running()
    yield


@pytest.fixture(scope="session")
def tiny_model_dir():
    """Path of the cached tiny Qwen2.5-VL (seed 0), built on first use."""
    from vlmrl.testing.tiny import ensure_tiny_model

    return str(ensure_tiny_model(seed=0))


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir):
    """The tiny model's Qwen2_5_VLProcessor."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests skip themselves where CUDA is absent (CI has none); everything else always runs."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (runs on a GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
