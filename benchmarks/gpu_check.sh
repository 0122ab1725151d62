#!/usr/bin/env bash
# The GPU checks of one lent device session, as one command:
#   bash benchmarks/gpu_check.sh            # logs and results under $OUT (default /tmp/vlmrl-gpu-out)
#   ALGOS=ppo STEPS=4 BUDGET=500 bash benchmarks/gpu_check.sh
# The device machine's copy of the tree carries the session's first .git, not the commit sent: the caller names it,
#   VLMRL_BENCH_COMMIT=<git rev-parse HEAD here> VLMRL_BENCH_DIRTY=0 (benchmarks/common.py's provenance reads them).
# On one H100 (2026-11-26): install and model build 35 s, `pytest -m gpu` 125 s (beside the build), GRPO's 6 steps
# 108 s; PPO at the 3B shape (critic offloaded to the CPU) did not finish 4 steps in 250 s. On one H200 (2026-11-28,
# ALGOS=grpo,ppo STEPS=3 BUDGET=560): tests 169 s, GRPO 80 s, PPO's 3 steps done at 551 s and the run killed in its
# shutdown: a session of 15 device minutes fits the tests and both at STEPS=3 with BUDGET=590 and timeout_s=600.
# The machine has torch but not vlmrl's other dependencies and no package index: wheels carried in .whl/ are
# installed first (pure-Python ones: hydra-core, omegaconf, antlr4, qwen-vl-utils, pebble, datasets, dill,
# multiprocess, and this checkout's transformers). vlmrl runs from the checkout (vlmrl.preprocess/rewards/configs
# linked as the package install maps them). `pytest -m gpu` runs beside the 3B model's build, then
# benchmarks/bench_gpu.py trains GRPO and PPO at the Qwen2.5-VL-3B shape and writes benchmarks/results/gpu.json.
set -uo pipefail
OUT=${OUT:-/tmp/vlmrl-gpu-out}
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-540}  # seconds this script may take in all
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for d in preprocess rewards configs; do [ -e "vlmrl/$d" ] || ln -s "../$d" "vlmrl/$d"; done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the checkout's vlmrl, also for scripts run by path
export VLMRL_CACHE=/tmp/vlmrl-cache TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
torch.cuda.get_device_name(0))" 2>&1 | tee "$OUT/env.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$OUT/env.log" 2>&1

OMP_NUM_THREADS=4 timeout 260 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -o addopts="-ra" \
  >"$OUT/pytest.log" 2>&1 &
TESTS=$!
timeout 240 $PY benchmarks/bench_gpu.py --build-only --steps "${STEPS:-6}" >"$OUT/build.log" 2>&1
echo "build: exit $? after ${SECONDS}s" | tee -a "$OUT/summary.log"
wait $TESTS
echo "pytest -m gpu: exit $? after ${SECONDS}s; $(tail -1 "$OUT/pytest.log")" | tee -a "$OUT/summary.log"

# the benchmark alone on the machine: its figures go to the results file
timeout $((BUDGET - SECONDS)) $PY benchmarks/bench_gpu.py --algos "${ALGOS:-grpo,ppo}" --steps "${STEPS:-6}" \
  >"$OUT/bench.log" 2>&1
echo "bench_gpu: exit $? after ${SECONDS}s" | tee -a "$OUT/summary.log"
cp benchmarks/results/gpu.json "$OUT/" 2>/dev/null
cp benchmarks/README.md "$OUT/bench_README.md" 2>/dev/null
cp /tmp/vlmrl-bench-gpu/run_*.log "$OUT/" 2>/dev/null
tail -5 "$OUT/pytest.log"
tail -n 4 /tmp/vlmrl-bench-gpu/run_*.log
