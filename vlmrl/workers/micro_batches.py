"""How a worker's samples are split into micro-batches (one forward/backward each).

Fixed size (``*_micro_batch_size_per_gpu``): consecutive runs of that many samples, padded to the longest of each run.

Token budget (verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` / ``log_prob_max_token_len_per_gpu``),
counted the way the forward computes:

- padded forwards: samples of similar length go together, as many as fit the budget padding included (samples x
  (longest prompt, image tokens included, + longest response) of the micro-batch). Short responses then travel in
  large micro-batches and long ones in small ones, instead of every run padding to its longest sample;
- packed forwards (``model.use_remove_padding=True``, verl's way): samples in their order, as many as fit the budget
  in real tokens (each distinct prompt once, every response), so a GRPO group stays together and its prompt runs once.

FSDP needs every rank to run the same number of passes: ranks agree on the largest count any of them needs (the
caller reduces it) and a rank that needs fewer splits its largest micro-batches (:func:`split_to`).
"""

from __future__ import annotations

from collections.abc import Callable


def fixed(rows: list[int], size: int) -> list[list[int]]:
    """Consecutive runs of ``size`` rows (the last may be shorter)."""
    size = max(1, int(size))
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def padded_tokens(batch: list[int], prompt_len: dict[int, int], response_len: dict[int, int]) -> int:
    """Tokens a forward over ``batch`` computes: its samples x (longest prompt + longest response)."""
    if not batch:
        return 0
    return len(batch) * (max(prompt_len[r] for r in batch) + max(response_len[r] for r in batch))


def packed_tokens(
    batch: list[int], prompt_len: dict[int, int], response_len: dict[int, int], prompt_of: dict[int, int]
) -> int:
    """Tokens a packed forward over ``batch`` computes: each distinct prompt (``prompt_of``) once, every response."""
    prompts = {prompt_of[r]: prompt_len[r] for r in batch}
    return sum(prompts.values()) + sum(response_len[r] for r in batch)


def cost_of(
    prompt_len: dict[int, int], response_len: dict[int, int], prompt_of: dict[int, int] | None = None
) -> Callable[[list[int]], int]:
    """A micro-batch's tokens as its forward computes them: :func:`padded_tokens`, or :func:`packed_tokens` with
    ``prompt_of`` (each row's prompt)."""
    if prompt_of is None:
        return lambda b: padded_tokens(b, prompt_len, response_len)
    return lambda b: packed_tokens(b, prompt_len, response_len, prompt_of)


def by_tokens(
    rows: list[int],
    prompt_lens: list[int],
    response_lens: list[int],
    budget: int,
    key: str,
    prompt_of: list[int] | None = None,
) -> list[list[int]]:
    """``rows`` (with their prompt and response token counts) in micro-batches of at most ``budget`` tokens. Padded
    (``prompt_of`` None): longest first, each sample joins the current micro-batch while its padded tokens still fit;
    every micro-batch keeps its rows in their original order. Packed (``prompt_of``: each row's prompt): rows in
    order, each joining the current micro-batch while its packed tokens still fit. A sample longer than the budget
    alone is an error naming ``key``."""
    if budget < 1:
        raise ValueError(f"{key}={budget}: a token budget must be >= 1")
    p = dict(zip(rows, prompt_lens))
    r = dict(zip(rows, response_lens))
    longest = max((p[x] + r[x] for x in rows), default=0)
    if longest > budget:
        raise ValueError(
            f"{key}={budget} is smaller than one sample of {longest} tokens (prompt with its image tokens + response); "
            "set it to at least max_prompt_length + max_response_length"
        )
    cost = cost_of(p, r, None if prompt_of is None else dict(zip(rows, prompt_of)))
    order = list(rows) if prompt_of is not None else sorted(rows, key=lambda x: (-(p[x] + r[x]), x))
    batches: list[list[int]] = []
    current: list[int] = []
    for row in order:
        if current and cost([*current, row]) > budget:
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    pos = {x: i for i, x in enumerate(rows)}
    return [sorted(b, key=pos.__getitem__) for b in batches]


def split_to(
    batches: list[list[int]],
    count: int,
    prompt_lens: dict[int, int],
    response_lens: dict[int, int],
    prompt_of: dict[int, int] | None = None,
) -> list[list[int]]:
    """Split the costliest micro-batches (padded tokens; packed ones with ``prompt_of``) in two (by length: the longer
    half first) until there are ``count``."""
    out = [list(b) for b in batches]
    cost = cost_of(prompt_lens, response_lens, prompt_of)
    while len(out) < count:
        i = max(range(len(out)), key=lambda k: (cost(out[k]), -k))
        b = out[i]
        if len(b) < 2:
            raise ValueError(f"cannot make {count} micro-batches of {sum(len(x) for x in out)} samples")
        ordered = sorted(b, key=lambda x: -(prompt_lens[x] + response_lens[x]))
        half = len(b) // 2
        keep = set(ordered[:half])
        out[i : i + 1] = [[x for x in b if x in keep], [x for x in b if x not in keep]]
    return out
