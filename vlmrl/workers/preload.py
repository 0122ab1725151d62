"""Imported once in the forkserver that local CPU workers fork from (``launch_local.start_forkserver``), never
elsewhere: torch, transformers' processors, the hybrid worker and (for a vLLM rollout) vLLM's engine modules are
imported there, in the background, while the driver reads the data; each worker forked from it starts with them imported
(a spawned worker imported them itself: ~10 s of the quick start's start-up on 2 cores).

A failing import is left to the worker, which imports the module again and reports what failed, naming its stage. The
heap is frozen at the end (``gc.freeze``): the workers' garbage collections, vLLM's at engine start among them, skip
these objects, and their pages stay shared with the forkserver's."""

import gc
import importlib
import os

from vlmrl.workers.launch_local import PRELOAD_VLLM, VLLM_MODULES, WORKER_MODULES

for _name in (*WORKER_MODULES, *(VLLM_MODULES if os.environ.get(PRELOAD_VLLM) == "1" else ())):
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 - the worker imports it again and reports the failure by stage
        continue
gc.collect()
gc.freeze()
