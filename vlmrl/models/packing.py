"""Padding-free ("packed") forward passes, verl's ``use_remove_padding=True``: a micro-batch's real tokens as one row,
so the linear layers, norms and MLPs (nearly all of the compute) never run on padding.

The row holds each distinct prompt once, then each sample's response continuing it (``pack_shared``: a GRPO group's
prompt runs once, as in the padded shared-prompt forward), or, when responses hold tool images, each sample's whole
sequence (``pack_rows``). Each sequence keeps its own M-RoPE positions (built on the padded batch by
``qwen_vl.rope_index``, the padding then dropped) and its own image, video and tool-image features (in row order, as
their pads appear). Attention stays within a sequence: the row's :class:`Segments` travel to every decoder layer's
attention function through transformers' keyword arguments (``vlmrl_segments``; not as ``cu_seq_lens_q``, which
another attention implementation would read without the shared prompts). The attention function is vlmrl's
:data:`VARLEN`, registered with transformers and used by every model vlmrl loads (``models.trainable.load_model``):

- a packed row, on CUDA in half precision with ``flash_attn`` installed: flash-attention's varlen kernel (causal
  segments only: a Gemma 3 row, with image tokens attending both ways and sliding-window layers, takes the next
  path);
- a packed row otherwise: the segments gathered into padded blocks (prompts, responses; segments of similar length
  together), one masked ``scaled_dot_product_attention`` per block, the real positions gathered back: only attention
  sees some padding, and the linear layers none (each block's mask: :meth:`Segments.masks`);
- any other call (a padded forward, the vision tower, generation): exactly transformers' ``sdpa``.

Log-probs, losses and gradients equal the padded forwards' (tests/test_packing.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

VARLEN = "vlmrl_varlen"
"""The attention implementation name vlmrl loads its models with (:func:`varlen_attention`)."""


@dataclass
class Block:
    """Segments of one kind gathered into a padded batch [S, L] for attention: ``queries`` [S, L] the row positions of
    each segment's tokens (0 past its end), ``keys`` [S, Lk] those of its keys (its prefix's, then its own), ``mask``
    [S, 1, L, Lk] which keys each query sees (all of its prefix, then itself causally), ``key_valid`` [S, Lk] which
    keys are real."""

    queries: torch.Tensor
    keys: torch.Tensor
    mask: torch.Tensor
    key_valid: torch.Tensor


@dataclass
class Segments:
    """A packed row's segments: ``bounds`` (the cumulative lengths, as ``cu_seq_lens``), each segment's ``prefixes``
    (the bounds ``a:b`` of the segment holding its shared prompt; ``(0, 0)``: none), the :class:`Block` s (segments of
    similar length together, so attention computes little padding), their query and key positions flattened (one
    gather each per layer) and ``out``: for each row position, its place among the blocks' flattened outputs."""

    bounds: list[int]
    prefixes: list[tuple[int, int]]
    blocks: list[Block]
    query_index: torch.Tensor
    key_index: torch.Tensor
    out: torch.Tensor
    positions: torch.Tensor | None = None
    """[T] each row position's 1-D position (set by the forward; a sliding-window layer reads it)."""
    image_blocks: torch.Tensor | None = None
    """[T] for a family whose image tokens attend both ways (``Family.bidirectional_images``): each row position's
    image (a number per run of image tokens), -1 elsewhere; None: causal everywhere."""
    _flash: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    _masks: dict[int, list[torch.Tensor]] = field(default_factory=dict, repr=False)

    def masks(self, sliding_window: int | None = None) -> list[torch.Tensor]:
        """Each block's mask [S, 1, L, Lk] as a layer sees it: the causal one, OR a query's own image's keys
        (``image_blocks``), AND, in a sliding-window layer, the keys less than ``sliding_window`` positions back
        (transformers' Gemma 3 masks: ``AND(sliding window, OR(causal, image block))``). Computed once per forward
        and window."""
        window = int(sliding_window or 0)
        if self.image_blocks is None and not window:
            return [b.mask for b in self.blocks]
        if window not in self._masks:
            out = []
            for b in self.blocks:
                mask = b.mask
                if self.image_blocks is not None:
                    qb, kb = self.image_blocks[b.queries], self.image_blocks[b.keys]
                    same = (qb[:, :, None] == kb[:, None, :]) & (qb[:, :, None] >= 0) & b.key_valid[:, None, :]
                    mask = mask | same[:, None]
                if window:
                    if self.positions is None:
                        raise ValueError("a sliding-window layer in a packed forward needs the segments' positions")
                    qp, kp = self.positions[b.queries], self.positions[b.keys]
                    mask = mask & (kp[:, None, :] > qp[:, :, None] - window)[:, None]
                out.append(mask)
            self._masks[window] = out
        return self._masks[window]

    def flash_keys(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """flash-attention's varlen layout of the keys: the row positions of each segment's keys (its prefix's, then
        its own), their cumulative lengths and the queries' (int32). Computed once per forward, on first use."""
        if self._flash is None:
            device = self.query_index.device
            spans = list(zip(zip(self.bounds[:-1], self.bounds[1:]), self.prefixes))
            parts = [torch.arange(a, b, device=device) for own, prefix in spans for a, b in (prefix, own)]
            lens = [(pb - pa) + (qb - qa) for (qa, qb), (pa, pb) in spans]
            cu_k = torch.tensor([0, *lens], device=device).cumsum(0).to(torch.int32)
            cu_q = torch.tensor(self.bounds, dtype=torch.int32, device=device)
            self._flash = (torch.cat(parts), cu_k, cu_q)
        return self._flash


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    vlmrl_segments: Segments | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature. A packed row ([1, H, T, D] query, [1, Hkv, T, D] key/value,
    ``vlmrl_segments`` given): each segment attends to its prefix, then causally to itself, whatever mask came with
    it; returns [1, T, H, D]. Any other call is transformers' ``sdpa``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if vlmrl_segments is None or query.shape[0] != 1 or query.shape[2] != vlmrl_segments.bounds[-1]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # the segments delimit the sequences, prefixes included; a mask transformers built is not needed (with 1-D
    # positions that restart in the packed row, a plain decoder infers "packed sequences" and masks each alone)
    seg = vlmrl_segments
    window = kwargs.get("sliding_window")  # Gemma 3's local layers pass theirs (None in a global layer)
    plain = seg.image_blocks is None and not window  # flash's varlen kernel: causal segments only
    if plain and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and _flash_varlen() is not None:
        return _flash(query, key, value, seg, dropout, scaling), None
    groups = query.shape[1] // key.shape[1]
    q, k, v = query[0], key[0], value[0]  # [H, T, D]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
    H, D = q.shape[0], q.shape[-1]
    qs = q[:, seg.query_index].split([b.queries.numel() for b in seg.blocks], dim=1)
    sizes = [b.keys.numel() for b in seg.blocks]
    ks, vs = k[:, seg.key_index].split(sizes, dim=1), v[:, seg.key_index].split(sizes, dim=1)
    out = []
    for b, mask, qb, kb, vb in zip(seg.blocks, seg.masks(window), qs, ks, vs):
        (S, L), Lk = b.queries.shape, b.keys.shape[1]
        o = F.scaled_dot_product_attention(
            qb.view(H, S, L, D).transpose(0, 1),
            kb.view(H, S, Lk, D).transpose(0, 1),
            vb.view(H, S, Lk, D).transpose(0, 1),
            attn_mask=mask,
            dropout_p=dropout,
            scale=scaling,
        )
        out.append(o.transpose(1, 2).reshape(S * L, H, D))
    return torch.cat(out)[seg.out].unsqueeze(0), None


def _flash_varlen():
    """flash-attention's varlen function, or None where the package is not installed."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segments, dropout: float, scale: float | None):
    """flash-attention varlen over a packed row: [1, H, T, D] in, [1, T, H, D] out. Each segment's keys are its
    prefix's then its own (:meth:`Segments.flash_keys`); ``causal=True`` aligns the queries to the last keys
    (flash-attention >= 2.1). GQA is handled by the kernel."""
    keys, cu_k, cu_q = seg.flash_keys()
    out = _flash_varlen()(
        q[0].transpose(0, 1),
        k[0, :, keys].transpose(0, 1),
        v[0, :, keys].transpose(0, 1),
        cu_q,
        cu_k,
        int(cu_q.diff().max()),
        int(cu_k.diff().max()),
        dropout_p=dropout,
        softmax_scale=scale,
        causal=True,
    )
    return out.unsqueeze(0)


def register() -> None:
    """Register :data:`VARLEN` with transformers (its masks are ``sdpa``'s); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, sdpa_mask)


register()


def supports_packing(model: torch.nn.Module) -> bool:
    """True when the model's language-model attention is vlmrl's :data:`VARLEN` (the one that reads the packed row's
    segments)."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    return getattr(text, "_attn_implementation", None) == VARLEN


@dataclass
class Packed:
    """A padded micro-batch laid out as one row of real tokens, in segments."""

    tokens: torch.Tensor
    """[N] indices into the flattened padded batch ([B * T]) of the row's tokens, in order."""
    segments: Segments
    """What the attention needs (:func:`varlen_attention`)."""
    predict: torch.Tensor
    """[M] row positions whose outputs predict the response tokens, sample after sample (M = all response tokens;
    an empty response: one, for its first column)."""
    predicted: torch.Tensor
    """[B * R] bool: which of the [B, R] response columns ``predict`` fills, row-major (the rest are padding)."""


def pack_rows(attention_mask: torch.Tensor, response_len: int) -> Packed:
    """Each sample's whole prompt+response as one segment (``attention_mask`` [B, T]: left-padded prompts, then
    ``response_len`` columns of right-padded responses). Every row's real tokens must be contiguous."""
    keep = _contiguous(attention_mask)
    B, T = keep.shape
    lens = keep.sum(-1)
    cu = F.pad(lens.cumsum(0), (1, 0))
    P = T - response_len
    prompt_lens, response_lens = keep[:, :P].sum(-1), keep[:, P:].sum(-1)
    j, predicted = _columns(response_lens, response_len)
    predict = cu[:-1, None] + prompt_lens[:, None] - 1 + j  # position prompt_len - 1 + j predicts response token j
    tokens = keep.flatten().nonzero().squeeze(-1)
    segments = _segments(cu, [(0, 0)] * B, [(cu[:-1], lens, None, None)])
    return Packed(tokens, segments, predict[predicted], predicted.flatten())


def pack_shared(
    attention_mask: torch.Tensor, response_len: int, prompt_rows: list[int], sample_prompt: list[int]
) -> Packed:
    """Each distinct prompt once (row ``prompt_rows[u]``'s prompt columns), then each sample's response as a segment
    continuing its prompt (``sample_prompt[b]`` = u): a GRPO group's prompt runs once, as in the padded shared-prompt
    forward, and no padding runs at all."""
    keep = _contiguous(attention_mask)
    B, T = keep.shape
    P = T - response_len
    rows = torch.tensor(prompt_rows, device=keep.device)
    inv = torch.tensor(sample_prompt, device=keep.device)
    p_keep = torch.zeros_like(keep)
    p_keep[rows, :P] = keep[rows, :P]
    r_keep = torch.zeros_like(keep)
    r_keep[:, P:] = keep[:, P:]
    prompt_lens = keep[rows, :P].sum(-1)
    response_lens = keep[:, P:].sum(-1)
    # prompt tokens in the order of prompt_rows (flattened index order follows rows: sort the rows' blocks)
    p_tokens = torch.cat([p_keep[r].nonzero().squeeze(-1) + r * T for r in prompt_rows]) if prompt_rows else rows
    r_tokens = r_keep.flatten().nonzero().squeeze(-1)
    lens = torch.cat([prompt_lens, response_lens])
    cu = F.pad(lens.cumsum(0), (1, 0))
    U = len(prompt_rows)
    p_start = cu[:U]
    r_start = cu[U:-1]
    spans = list(zip(p_start.tolist(), (p_start + prompt_lens).tolist()))
    prefixes = [spans[u] for u in sample_prompt]
    j, predicted = _columns(response_lens, response_len)
    last_prompt = (p_start + prompt_lens - 1)[inv]
    # response token 0 is predicted by the prompt's last token, token j > 0 by the sample's token j - 1
    predict = torch.where(j == 0, last_prompt[:, None], r_start[:, None] + j - 1)
    kinds = [(p_start, prompt_lens, None, None), (r_start, response_lens, p_start[inv], prompt_lens[inv])]
    segments = _segments(cu, [(0, 0)] * U + prefixes, kinds)
    return Packed(torch.cat([p_tokens, r_tokens]), segments, predict[predicted], predicted.flatten())


MAX_WASTE = 0.1
"""A block of segments grows while its padding stays within this share of its real tokens."""


def _segments(cu: torch.Tensor, prefixes: list[tuple[int, int]], kinds: list[tuple]) -> Segments:
    """The row's :class:`Segments`: each kind of segment (``(starts, lens, prefix_starts, prefix_lens)``) sorted by
    length and cut into blocks whose padding is at most ``MAX_WASTE`` of their real tokens."""
    blocks, real = [], []
    for starts, lens, p_starts, p_lens in kinds:
        if len(lens) == 0:
            continue
        n = lens.tolist()
        groups: list[list[int]] = [[]]
        tokens = 0
        for s in sorted(range(len(n)), key=lambda i: -n[i]):  # longest first; a block's first is its longest
            g = groups[-1]
            if g and n[g[0]] * (len(g) + 1) > (1 + MAX_WASTE) * (tokens + n[s]):
                groups.append([])
                tokens = 0
            groups[-1].append(s)
            tokens += n[s]
        for g in groups:
            i = torch.tensor(sorted(g), device=lens.device)
            block, valid = _block(
                starts[i], lens[i], None if p_starts is None else p_starts[i], None if p_lens is None else p_lens[i]
            )
            blocks.append(block)
            real.append(valid.flatten())
    T = int(cu[-1])
    flat_valid = torch.cat(real)
    queries = torch.cat([b.queries.flatten() for b in blocks])
    out = torch.empty(T, dtype=torch.long, device=cu.device)
    out[queries[flat_valid]] = flat_valid.nonzero().squeeze(-1)  # row position -> its place among the outputs
    keys = torch.cat([b.keys.flatten() for b in blocks])
    return Segments(cu.tolist(), prefixes, blocks, queries, keys, out)


def _block(
    starts: torch.Tensor,
    lens: torch.Tensor,
    prefix_starts: torch.Tensor | None = None,
    prefix_lens: torch.Tensor | None = None,
) -> tuple[Block, torch.Tensor]:
    """Segments ``starts[s] : starts[s] + lens[s]`` of the row (each after its prefix, when given) as a padded block,
    and which of its [S, L] places are real."""
    L = max(int(lens.max()), 1)
    cols = torch.arange(L, device=lens.device)
    valid = cols[None, :] < lens[:, None]
    queries = torch.where(valid, starts[:, None] + cols[None, :], 0)
    keys, mask = queries, torch.ones(L, L, dtype=torch.bool, device=lens.device).tril()[None] & valid[:, None, :]
    key_valid = valid
    if prefix_starts is not None and prefix_lens is not None:
        Lp = int(prefix_lens.max())
        pcols = torch.arange(Lp, device=lens.device)
        pvalid = pcols[None, :] < prefix_lens[:, None]
        keys = torch.cat([torch.where(pvalid, prefix_starts[:, None] + pcols[None, :], 0), queries], dim=1)
        mask = torch.cat([pvalid[:, None, :].expand(-1, L, -1), mask], dim=-1)
        key_valid = torch.cat([pvalid, valid], dim=1)
    return Block(queries, keys, mask.unsqueeze(1), key_valid), valid


def _columns(response_lens: torch.Tensor, response_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's response columns [B, R] and which of them to predict: its tokens (an empty response: its
    first column, so every sample has an output)."""
    j = torch.arange(response_len, device=response_lens.device).expand(len(response_lens), -1)
    return j, j < response_lens.clamp(min=1)[:, None]


def _contiguous(attention_mask: torch.Tensor) -> torch.Tensor:
    """``attention_mask`` as bool, checked: each row's real tokens are one contiguous run."""
    keep = attention_mask.bool()
    lens = keep.sum(-1)
    first = torch.where(lens > 0, keep.long().argmax(-1), torch.zeros_like(lens))
    cols = torch.arange(keep.shape[1], device=keep.device)
    if not bool((keep == ((cols >= first[:, None]) & (cols < (first + lens)[:, None]))).all()):
        raise ValueError("packing needs each row's real tokens contiguous (left-padded prompt, right-padded response)")
    return keep
