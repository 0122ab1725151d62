#!/usr/bin/env bash
# CPU quick start (interim, until the trainer lands): build the tiny Qwen2.5-VL and sample from it with vLLM.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
export OMP_NUM_THREADS=1 VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
.venv/bin/python - <<'PY'
from PIL import Image
from vlmrl.config import RolloutConfig
from vlmrl.models import qwen_vl
from vlmrl.models.tiny import ensure_tiny_model
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.vllm import VLLMRollout
from vlmrl.batch import PromptSample
from transformers import AutoProcessor

path = str(ensure_tiny_model(0))
proc = AutoProcessor.from_pretrained(path)
img = qwen_vl.resize_image(Image.new("RGB", (56, 56), (255, 0, 0)), 28, *qwen_vl.pixel_bounds(proc.image_processor))
msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the shape?"}]}]
text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
p = PromptSample(0, "demo:0", "demo", msgs, text, qwen_vl.engine_prompt_ids(proc.tokenizer, text, 1), [img],
                 [(56, 56)], "red")
rb = VLLMRollout(path, rollout_cfg=RolloutConfig(), max_model_len=256, limit_images=1).generate(
    [p], SamplingSpec(n=4, max_tokens=16))
for r in rb.response_ids:
    print(repr(proc.tokenizer.decode(r, skip_special_tokens=True)))
PY
