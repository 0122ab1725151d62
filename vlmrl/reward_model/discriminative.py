"""The discriminative reward model on a worker: a Qwen2.5-VL backbone with a one-output score head, sharded with
FSDP2 beside the policy (verl's colocated reward model), run batched and without gradients.

It reads exactly what the policy produced: the policy's prompt ids, image inputs and response ids when it shares the
policy's tokenizer and template (``reward_model.model.input_tokenizer`` unset), else each conversation decoded and
re-rendered in its own chat template and processor. Its score is the head's output at the last token
(``models.forward.last_token_scores``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.config.plan import RewardModelPlan
from vlmrl.models import qwen_vl
from vlmrl.models.forward import last_token_scores
from vlmrl.models.inputs import (
    ModelInputs,
    build_inputs,
    expand_pads,
    process_images,
    process_response_images,
    to_device,
)
from vlmrl.models.value_head import add_value_head, require_score_head


class RewardModelWorker:
    """The reward model of one rank: ``score`` on the rank's samples."""

    def __init__(self, plan: RewardModelPlan, device: str, policy_processor: Any) -> None:
        from transformers import AutoProcessor

        from vlmrl.models.trainable import compute_dtype, fsdp_wrap, load_model

        self.plan = plan
        self.device = device
        self.policy_processor = policy_processor
        where = f"reward_model.model.path={plan.path}"
        if Path(plan.path).is_dir():
            require_score_head(plan.path)
        self.model = load_model(plan.path, device, plan.trust_remote_code, where=where).eval()
        self.head_source = add_value_head(self.model, plan.path)
        if self.head_source == "new":  # a hub id without a local folder: its head was not found either
            raise ValueError(f"{where}: no score head found (score.weight)")
        self.model.requires_grad_(False)
        self.processor = policy_processor
        if plan.rerender:
            self.processor = AutoProcessor.from_pretrained(plan.path, trust_remote_code=plan.trust_remote_code)
        self.vision_ids = qwen_vl.vision_token_ids(self.processor.tokenizer)
        tok = self.processor.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        if dist.is_initialized():
            self.model = fsdp_wrap(self.model, device, plan.param_offload, True, compute_dtype(plan.dtype, device))

    # ------------------------------------------------------------------------------------------------ inputs
    def _rerendered(self, prompts: list[PromptSample], rollout: RolloutBatch) -> tuple[list[PromptSample], Any]:
        """Each sample as its own prompt, rendered in the reward model's chat template: the conversation (prompt
        messages and the decoded response) → the reward model's prompt ids and response ids."""
        tok = self.processor.tokenizer
        from vlmrl.reward_model.judge import plain_text

        texts = self.policy_processor.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        texts = [plain_text(t, tok) for t in texts]
        out_prompts, out_resp = [], []
        for i, text in enumerate(texts):
            p = prompts[i // rollout.n]
            head = self.processor.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
            whole = self.processor.apply_chat_template(
                [*p.messages, {"role": "assistant", "content": [{"type": "text", "text": text}]}],
                tokenize=False,
                add_generation_prompt=False,
            )
            if not whole.startswith(head):
                raise ValueError(
                    "the reward model's chat template does not render a conversation as its prompt followed by the "
                    f"answer (prompt {head[-80:]!r}, conversation {whole[-160:]!r})"
                )
            tail = whole[len(head) :].rstrip()  # the answer and its end-of-turn token
            out_prompts.append(_with_ids(p, tok(head, add_special_tokens=False)["input_ids"]))
            out_resp.append(tok(tail, add_special_tokens=False)["input_ids"])
        rb = RolloutBatch(
            prompt_ids=[q.prompt_ids for q in out_prompts],
            response_ids=out_resp,
            logprobs=[[] for _ in out_resp],
            finish_reasons=list(rollout.finish_reasons),
            n=1,
        )
        return out_prompts, rb

    def _expanded(self, ids: list[int], v: Any) -> list[int]:
        """Prompt ids with one pad per image and video → each pad expanded to its tokens (the engine's convention,
        which ``build_inputs`` takes)."""
        return expand_pads(ids, v, self.processor, qwen_vl.family_of(qwen_vl.inner_model(self.model).config))

    def inputs(self, prompts: list[PromptSample], rollout: RolloutBatch) -> tuple[ModelInputs, int]:
        """The reward model's inputs for every sample and how many responses ``max_length`` cut."""
        if self.plan.rerender:
            if rollout.trajectories:
                raise ValueError(
                    "reward_model.model.input_tokenizer re-renders single-turn conversations only; a multi-turn "
                    "run's reward model must share the policy's tokenizer (unset input_tokenizer)"
                )
            prompts, rollout = self._rerendered(prompts, rollout)
            vision = process_images(self.processor, prompts)
            rollout.prompt_ids = [self._expanded(ids, v) for ids, v in zip(rollout.prompt_ids, vision)]
        else:
            vision = process_images(self.processor, prompts)
        cut = 0
        if self.plan.max_length:
            resp = []
            for pids, rids in zip(rollout.prompt_ids, rollout.response_ids):
                room = max(1, self.plan.max_length - len(pids))
                cut += len(rids) > room
                resp.append(list(rids[:room]))
            if cut:
                if rollout.trajectories:
                    raise ValueError("reward_model.max_length cut a multi-turn response: raise it")
                rollout = RolloutBatch(rollout.prompt_ids, resp, [[] for _ in resp], rollout.finish_reasons, rollout.n)
        x = build_inputs(
            prompts,
            rollout,
            vision,
            self.pad_id,
            process_response_images(self.processor, rollout),
        )
        return x, cut

    # ------------------------------------------------------------------------------------------------- score
    @torch.no_grad()
    def score(self, x: ModelInputs, n_micro: int | None = None) -> torch.Tensor:
        """Scores [B] of every sample, in micro-batches of ``micro_batch_size``; ``n_micro``: run exactly this many
        forwards (every rank of the FSDP group must run as many: the extra ones score a copy of the first sample,
        dropped)."""
        out = torch.zeros(x.batch_size, dtype=torch.float32)
        step = max(1, self.plan.micro_batch_size)
        chunks = [list(range(s, min(s + step, x.batch_size))) for s in range(0, x.batch_size, step)]
        if n_micro is not None:
            if len(chunks) > n_micro:
                raise ValueError(f"{x.batch_size} samples need {len(chunks)} micro-batches, {n_micro} were planned")
            chunks += [[]] * (n_micro - len(chunks))
        for idx in chunks:
            s, _ = last_token_scores(self.model, to_device(x.select(idx or [0]), self.device), self.vision_ids)
            if idx:
                out[idx] = s.cpu()
        return out


def _with_ids(p: PromptSample, ids: list[int]) -> PromptSample:
    """``p`` with other prompt ids (the reward model's rendering)."""
    return replace(p, prompt_ids=list(ids))
