"""The critic's model: a Qwen-VL backbone (any family) whose language-model head is replaced by a one-output linear
layer (a value per token), the token-classification convention verl uses for critics (one label).

Every forward of the policy (vision features once per prompt, M-RoPE positions, shared prompt KV cache, the dummy
vision pass) runs the critic unchanged: its "logits" are [B, T, 1], the value of each position. A saved head is read
from the checkpoint folder when present (``score.weight`` / ``score.bias``: verl's and transformers'
token-classification name, which vlmrl's critic export writes too; ``v_head.summary.*``: TRL's value-head models);
else the head starts as transformers initialises a classification head (normal(0, initializer_range), zero bias).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

HEAD_NAMES = (("score.weight", "score.bias"), ("v_head.summary.weight", "v_head.summary.bias"))
"""Where a saved value head lives in a checkpoint, in the order they are looked for."""


def saved_value_head(path: str) -> tuple[dict[str, torch.Tensor], str] | None:
    """The value head stored in a local checkpoint folder (its safetensors files only: nothing in them runs), with
    the name it was found under; None when the folder holds none (a policy checkpoint) or ``path`` is a hub id."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else None
    for name in files or [p.name for p in sorted(folder.glob("*.safetensors"))]:
        file = (folder / name).resolve()
        if folder.resolve() not in file.parents:
            raise ValueError(f"{index}: names {name}, outside the checkpoint folder")
        with safe_open(str(file), framework="pt") as f:
            keys = set(f.keys())
            for weight, bias in HEAD_NAMES:
                if weight in keys:
                    out = {"weight": f.get_tensor(weight).float()}
                    if bias in keys:
                        out["bias"] = f.get_tensor(bias).float()
                    return out, weight
    return None


def add_value_head(model: torch.nn.Module, path: str) -> str:
    """Replace ``model.lm_head`` by a value head (fp32, on the model's device); returns where it came from (the
    checkpoint's tensor name, or "new")."""
    config = model.config
    text = getattr(config, "text_config", config)
    hidden = int(text.hidden_size)
    old = model.lm_head
    head = torch.nn.Linear(hidden, 1, bias=True, device=old.weight.device, dtype=torch.float32)
    saved = saved_value_head(path)
    with torch.no_grad():
        if saved is None:
            head.weight.normal_(0.0, float(getattr(text, "initializer_range", 0.02)))
            head.bias.zero_()
            source = "new"
        else:
            state, source = saved
            weight = state["weight"].reshape(1, -1)
            if weight.shape[1] != hidden:
                raise ValueError(f"{path}: value head {source} has {weight.shape[1]} inputs, the model {hidden}")
            if "bias" in state and state["bias"].numel() != 1:
                raise ValueError(
                    f"{path}: value head {source}'s bias has {state['bias'].numel()} values; a value head has one "
                    "output (a classification head with several labels is not a critic or a reward model)"
                )
            head.weight.copy_(weight)
            head.bias.copy_(state.get("bias", torch.zeros(1)).reshape(1))
    model.lm_head = head
    for c in {id(config): config, id(text): text}.values():
        c.tie_word_embeddings = False  # the head is no longer the embedding's transpose
    return source


def export_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A critic's full state dict under checkpoint names: the head as ``score.*`` (so the folder loads as a critic
    here and in verl), the rest unchanged."""
    return {("score." + k[len("lm_head.") :] if k.startswith("lm_head.") else k): v for k, v in state.items()}


def checkpoint_tensors(folder: str | Path) -> dict[str, list[int]] | None:
    """Every tensor's name and shape in a local folder's ``*.safetensors`` files, read from their JSON headers
    (nothing is loaded); None for a folder without them (a hub id)."""
    import struct

    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        return None
    out: dict[str, list[int]] = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        out.update({name: list(t["shape"]) for name, t in header.items() if name != "__metadata__"})
    return out


def checkpoint_params(folder: str | Path) -> int | None:
    """Parameters stored in a local folder's ``*.safetensors`` files (their headers); None without them."""
    tensors = checkpoint_tensors(folder)
    if tensors is None:
        return None
    total = 0
    for shape in tensors.values():
        k = 1
        for d in shape:
            k *= d
        total += k
    return total


def policy_head_problem(folder: str | Path, config: dict) -> str | None:
    """Why a local folder cannot be loaded as a policy: it holds a score head (a critic's or a reward model's
    export) or untied embeddings, and no language-model head, which transformers would initialise at random on each
    load (the engine and the trainer would hold different heads). None when it can."""
    tensors = checkpoint_tensors(folder)
    if tensors is None or any(k == "lm_head.weight" or k.endswith(".lm_head.weight") for k in tensors):
        return None  # (InternVL's checkpoints hold it as language_model.lm_head.weight)
    text = config.get("text_config") or {}
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    score = next((w for w, _ in HEAD_NAMES if w in tensors), None)
    if score is None and tied:
        return None
    what = "unties its embeddings from the output"
    if score:
        what = f"holds a value or score head ({score}: a critic's or a reward model's export)"
    return (
        f"{folder} {what} and has no language-model head (lm_head.weight): as a policy its head would start random "
        "on every load. Give the policy's own folder (a critic belongs in critic.model.path, a reward model in "
        "reward_model.model.path)."
    )


def require_score_head(path: str) -> str:
    """The name of the score head stored in ``path`` (a local folder); ValueError when it holds none: a chat model
    is a judge (reward_model.style=generative), not a discriminative reward model."""
    found = saved_value_head(path)
    if found is None:
        raise ValueError(
            f"reward_model.model.path={path} holds no score head (score.weight, as token- or sequence-classification "
            "reward models save it): a discriminative reward model needs one (train one with python -m "
            "vlmrl.reward_model.train); a chat model can judge instead: reward_model.style=generative"
        )
    return found[1]
