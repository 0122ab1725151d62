"""Export a training checkpoint's policy as a Hugging Face folder (loadable by transformers and by vLLM), or its
critic (``--critic``: the backbone with the value head as ``score.weight`` / ``score.bias``, which vlmrl's
``critic.model.path`` loads with its head, as verl's token-classification critics).

    python -m vlmrl.export --checkpoint runs/quickstart/global_step_40 --output exported/ [--dtype bfloat16]
        [--model BASE_MODEL] [--trust-remote-code] [--critic]

Reads the run's ``config.yaml`` inside the checkpoint for the base model path and LoRA settings, loads the sharded
policy weights (any number of training workers; no process group needed), merges LoRA adapters into the base weights,
and writes ``model.safetensors`` + config + processor/tokenizer files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from vlmrl.models import qwen_vl
from vlmrl.models.trainable import check_output_folder, load_model
from vlmrl.safe_load import UnsafeCheckpointError, safe_dcp_load
from vlmrl.timing import Timer
from vlmrl.trainer import checkpoint as ckpt

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def saved_config(path: Path) -> dict[str, Any]:
    """A checkpoint's ``config.yaml`` as data: plain YAML (no tags), and no interpolation in what export reads (the
    model settings of the actor and the critic). The trainer writes it resolved, so a ``${...}`` there (an environment
    variable, a resolver) is refused naming its key, never resolved: a checkpoint from elsewhere must not read this
    machine's environment into a model path."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not a readable config ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a config (a mapping of settings)")

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")
        elif isinstance(value, str) and "${" in value:
            raise ValueError(
                f"{path}: {key} holds an interpolation (${{...}}); a saved config is data, resolved when "
                "it was written: give the base model with --model"
            )

    for key in ("actor_rollout_ref.model", "critic.model"):  # what export reads
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        walk(node, key)
    return data


def export_checkpoint(
    checkpoint: str | Path,
    output: str | Path,
    dtype: str = "float32",
    *,
    model_path: str | None = None,
    trust_remote_code: bool = False,
    critic: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write the policy of ``checkpoint`` (a ``global_step_N`` folder, or a run folder: its latest checkpoint) as an HF
    model folder at ``output``; returns ``output``.

    The checkpoint is data: nothing stored in it runs (``vlmrl.safe_load``), and ``trust_remote_code`` comes from the
    caller (``--trust-remote-code``), never from the checkpoint's own config. ``model_path`` overrides the base model
    the checkpoint's config names. ``critic``: write the critic instead (``critic.model.path`` is its base)."""
    from omegaconf import OmegaConf
    from transformers import AutoProcessor

    check_output_folder(output, overwrite)  # (before anything loads)
    src = Path(checkpoint)
    if not ckpt.is_complete(src):
        latest = ckpt.find_resume(src)
        if latest is None:
            raise FileNotFoundError(f"{src} is neither a complete global_step_N checkpoint nor a run folder with one")
        src = latest
    if dtype not in _DTYPES:
        raise ValueError(f"--dtype {dtype!r}: use one of {sorted(_DTYPES)}")
    cfg = OmegaConf.create(saved_config(src / "config.yaml"))
    mcfg = cfg.actor_rollout_ref.model
    key, base = "actor_rollout_ref.model.path", str(mcfg.path)
    if critic:
        if not (src / "critic" / ".metadata").is_file():
            raise FileNotFoundError(f"{src} holds no critic (critic/.metadata): the run trained without one")
        cpath = OmegaConf.select(cfg, "critic.model.path", default=None)
        key, base = ("critic.model.path", str(cpath)) if cpath else (key, base)
    path, trust = model_path or base, bool(trust_remote_code)
    where = f"--model {path}" if model_path else f"{src}/config.yaml {key}={path}"
    if not Path(path).expanduser().is_dir() and (Path(path).is_absolute() or path.startswith((".", "~"))):
        raise FileNotFoundError(f"the base model folder {path} ({where}) does not exist: give it with --model BASE")
    model = load_model(path, "cpu", trust, where=where)
    if critic:
        return _export_critic(model, path, src, Path(output), _DTYPES[dtype], trust)
    if int(mcfg.get("lora_rank", 0) or 0) > 0:
        from vlmrl.workers.lora import apply_lora

        model = apply_lora(model, mcfg)
    state = {"model": model.state_dict()}
    safe_dcp_load(state, str(src / "actor"), allow_partial_load=False)
    model.load_state_dict(state["model"])
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    qwen_vl.save_pretrained(model.to(_DTYPES[dtype]), out)  # the hub's layout, which vLLM loads
    AutoProcessor.from_pretrained(path, trust_remote_code=trust).save_pretrained(out)
    return out


def _export_critic(model: torch.nn.Module, path: str, src: Path, out: Path, dtype: torch.dtype, trust: bool) -> Path:
    """The critic of checkpoint ``src`` on ``model`` (its base), written with the head under ``score.*``."""
    from safetensors.torch import save_file
    from transformers import AutoProcessor

    from vlmrl.models.value_head import add_value_head, export_names

    add_value_head(model, path)
    state = {"model": model.state_dict()}
    safe_dcp_load(state, str(src / "critic"), allow_partial_load=False)
    model.load_state_dict(state["model"])
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in export_names(model.state_dict()).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    AutoProcessor.from_pretrained(path, trust_remote_code=trust).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m vlmrl.export --checkpoint DIR --output DIR [--dtype float32|bfloat16|float16]
    [--overwrite]``."""
    ap = argparse.ArgumentParser(prog="python -m vlmrl.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a global_step_N folder, or a run folder (its latest)")
    ap.add_argument("--output", required=True, help="folder for the HF model")
    ap.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="saved weight dtype")
    ap.add_argument("--model", default=None, help="base model folder or hub id (default: the one the run used)")
    ap.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the base model folder's own Python code (off: a checkpoint's config cannot turn it on)",
    )
    ap.add_argument("--critic", action="store_true", help="export the critic (value model) instead of the policy")
    ap.add_argument("--overwrite", action="store_true", help="replace a model already in --output")
    a = ap.parse_args(argv)
    sw = Timer.start()

    try:
        out = export_checkpoint(
            a.checkpoint,
            a.output,
            a.dtype,
            model_path=a.model,
            trust_remote_code=a.trust_remote_code,
            critic=a.critic,
            overwrite=a.overwrite,
        )
    except (FileNotFoundError, FileExistsError, ValueError, UnsafeCheckpointError) as e:
        print(f"vlmrl.export: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the base model (transformers' loaders): a hub id offline, a folder missing files
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"vlmrl.export: the base model could not be loaded ({first}); give --model a local folder", file=sys.stderr
        )
        return 2
    print(f"[vlmrl] exported {a.checkpoint} -> {out} ({sw.elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    sys.exit(main())
