"""The rollout protocol over transformers ``generate``: for machines without vLLM (the GPU box here, laptops).

Batched with left padding; samples with ``num_return_sequences``; per-token log-probs of the sampled tokens from the
raw logits (as vLLM reports them); vision tokens suppressed. Token-in like the vLLM rollout: the prompt ids (one pad
per image and video) are expanded here from the processor's grids, and the M-RoPE positions are given to ``generate``
(``qwen_vl.rope_index``, the engine's and the trainer's), so a video prompt is sampled with the positions it is
trained with. The policy module itself generates (no second copy of the weights), so ``update_weights`` has nothing to
copy when the rollout shares the trainer's model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.models import qwen_vl
from vlmrl.models.forward import image_token_types, token_logprobs
from vlmrl.models.inputs import PromptImages, expand_pads, process_images
from vlmrl.models.qwen_vl import vision_token_ids
from vlmrl.rollout.base import SamplingSpec, TurnOutput, TurnRequest
from vlmrl.timing import Timer


def _is_fsdp(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


class HFRollout:
    """Rollouts with ``model.generate`` on a (possibly shared) transformers model."""

    def __init__(self, model: torch.nn.Module, processor: Any, *, micro_batch_prompts: int = 64) -> None:
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.vision_ids = vision_token_ids(self.tokenizer)
        self.micro_batch_prompts = micro_batch_prompts
        gc = getattr(model, "generation_config", None)
        eos = getattr(gc, "eos_token_id", None) if gc is not None else None
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [self.tokenizer.eos_token_id])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]

    def _encode(self, prompts: list[PromptSample]) -> dict[str, torch.Tensor]:
        return self._batch([p.prompt_ids for p in prompts], process_images(self.processor, prompts))

    def _batch(self, ids: list[list[int]], vision: list[PromptImages]) -> dict[str, Any]:
        """``generate``'s inputs for token-in prompts (one pad per image and video) and their processed images and
        videos: pads expanded, left padding, vision inputs concatenated in row order, M-RoPE positions."""
        pads = self.vision_ids
        config = qwen_vl.inner_model(self.model).config
        family = qwen_vl.family_of(config)
        rows = [expand_pads(list(x), v, self.processor, family) for x, v in zip(ids, vision)]
        width = max(len(x) for x in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, x in enumerate(rows):
            input_ids[i, width - len(x) :] = torch.tensor(x)
            attn[i, width - len(x) :] = 1

        def cat(name: str) -> torch.Tensor | None:
            parts = [getattr(v, name) for v in vision if getattr(v, name) is not None]
            return torch.cat(parts) if parts else None

        enc: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attn}
        if family.mrope:
            grids = {k: cat(k) for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")}
            enc["position_ids"] = qwen_vl.rope_index(input_ids, attn, pads, config, *grids.values())
            enc["mm_token_type_ids"] = qwen_vl.mm_token_type_ids(input_ids, pads)
        # (1-D RoPE: generate counts positions over the attention mask, as the trainer does)
        enc |= image_token_types(self.model, input_ids)  # Gemma 3: generate's first pass, both ways in each image
        keys = ["pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"]
        if family.tiles:  # the family's batch layout of tiles
            keys = keys[2:]
            enc |= family.tiles.generate_inputs([v.tiled for v in vision])
        for key in keys:
            value = cat(key)
            if value is not None:
                enc[key] = value
        dev = self._device()
        return {k: v.to(dev) for k, v in enc.items()}

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[PromptSample], spec: SamplingSpec) -> RolloutBatch:
        """``spec.n`` samples per prompt, grouped by prompt."""
        sw = Timer.start()
        batch = RolloutBatch([], [], [], [], n=spec.n)
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(prompts), self.micro_batch_prompts):
                self._generate_chunk(prompts[i : i + self.micro_batch_prompts], spec, batch)
        finally:
            self.model.train(was_training)
        batch.timing["generate_s"] = sw.elapsed
        return batch

    @torch.no_grad()
    def generate_turns(self, requests: list[TurnRequest], spec: SamplingSpec) -> list[TurnOutput]:
        """One sample per request, token-in (image pads expanded here as the processor would), each cut at its own
        ``max_tokens`` (tokens after a request's limit are generated with the batch and dropped: the kept ones are
        sampled exactly as a shorter call would)."""
        out: list[TurnOutput] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(requests), self.micro_batch_prompts):
                out += self._turn_chunk(requests[i : i + self.micro_batch_prompts], spec)
        finally:
            self.model.train(was_training)
        return out

    def _turn_chunk(self, requests: list[TurnRequest], spec: SamplingSpec) -> list[TurnOutput]:
        vision = []
        for r in requests:
            if r.images:
                enc = self.processor.image_processor(images=list(r.images), return_tensors="pt")
                vision.append(PromptImages(enc["pixel_values"], enc["image_grid_thw"]))
            else:
                vision.append(PromptImages(None, None))
        enc2 = self._batch([list(r.ids) for r in requests], vision)
        longest = max(max(1, r.max_tokens) for r in requests)
        seqs, lps = self._run_generate(enc2, dataclasses.replace(spec, n=1, max_tokens=longest))
        result = []
        for row, r in enumerate(requests):
            limit = max(1, r.max_tokens)
            row_ids = seqs[row].tolist()[:limit]
            end, finish = len(row_ids), "length"
            for j, t in enumerate(row_ids):
                if t in self.eos_ids and not spec.ignore_eos:
                    end, finish = j + 1, "stop"
                    break
            result.append(TurnOutput(row_ids[:end], lps[row, :end].tolist(), finish))
        return result

    def _generate_chunk(self, prompts: list[PromptSample], spec: SamplingSpec, batch: RolloutBatch) -> None:
        if spec.n > 1 and any(len(p.images) > 1 for p in prompts):
            family = qwen_vl.family_of(qwen_vl.inner_model(self.model).config)
            if family.hf_repeat_prompts:  # each prompt n times, one sample each: the same rows in the same order
                prompts, spec = [p for p in prompts for _ in range(spec.n)], dataclasses.replace(spec, n=1)
        enc = self._encode(prompts)
        seqs, lps = self._run_generate(enc, spec)
        prompt_ids = enc["input_ids"].repeat_interleave(spec.n, dim=0)
        prompt_mask = enc["attention_mask"].repeat_interleave(spec.n, dim=0)
        for row in range(seqs.shape[0]):
            ids = seqs[row].tolist()
            end, finish = len(ids), "length"
            for j, t in enumerate(ids):
                if t in self.eos_ids and not spec.ignore_eos:
                    end, finish = j + 1, "stop"
                    break
            batch.prompt_ids.append(prompt_ids[row][prompt_mask[row].bool()].tolist())
            batch.response_ids.append(ids[:end])
            batch.logprobs.append(lps[row, :end].tolist())
            batch.finish_reasons.append(finish)

    def _run_generate(self, enc: dict[str, torch.Tensor], spec: SamplingSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """(generated ids [B*n, R], their raw-logit log-probs [B*n, R']) of one ``generate`` call."""
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=spec.max_tokens,
            num_return_sequences=spec.n,
            return_dict_in_generate=True,
            output_logits=True,
            suppress_tokens=self.vision_ids.never_sample,
            pad_token_id=self.pad_id,
            eos_token_id=None if spec.ignore_eos else self.eos_ids,
            use_cache=True,
        )
        if spec.ignore_eos:
            gen_kwargs["min_new_tokens"] = spec.max_tokens
        if spec.is_greedy:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            gen_kwargs.update(
                do_sample=True,
                temperature=spec.temperature,
                top_p=spec.top_p,
                top_k=spec.top_k if spec.top_k > 0 else 0,
            )
        # generating with the trainer's FSDP2 module: gather the root's own weights (embeddings, head, norm) for the
        # whole generate call; a peft wrapper's generate bypasses the root forward whose hook would gather them
        root = self.model if _is_fsdp(self.model) else None
        if root is not None:
            root.unshard()
        try:
            out = self.model.generate(**enc, **gen_kwargs)
        finally:
            if root is not None:
                root.reshard()
        plen = enc["input_ids"].shape[1]
        seqs = out.sequences[:, plen:]
        # raw logits -> log-probs of the chosen tokens (vLLM reports raw log-probs too)
        logits = torch.stack(out.logits, dim=1)  # [B*n, R, V]
        return seqs, token_logprobs(logits, seqs[:, : logits.shape[1]])

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Copy weights into the generating model, unless it is the trainer's own module (then nothing to do)."""
        sw = Timer.start()
        family = qwen_vl.family_of(qwen_vl.inner_model(self.model).config)
        params = {family.checkpoint_name(n): p for n, p in self.model.named_parameters()}  # pushes: the hub's names
        with torch.no_grad():
            for name, tensor in named_tensors:
                p = params.get(name)
                if p is None:
                    raise KeyError(f"HF rollout model has no parameter {name!r}")
                tensor = family.checkpoint_tensor(name, tensor)  # pushes come in the checkpoint's layout
                if p.data_ptr() != tensor.data_ptr():
                    p.copy_(tensor.to(p.dtype))
        return sw.elapsed

    def sleep(self) -> None:
        """Nothing to free: the HF rollout holds no separate cache between calls."""

    def wake(self) -> None:
        """Nothing to restore."""
