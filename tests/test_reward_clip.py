"""clip_consistency on a tiny random CLIP built offline (no hub access), loaded through the function's model_path."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vlmrl.batch import RewardSample
from vlmrl.config import CustomRewardFunctionConfig, RewardConfig
from vlmrl.scoring import RewardManager


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in chars + [c + "</w>" for c in chars]:
        vocab.setdefault(c, len(vocab))
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={
            "vocab_size": len(vocab),
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 16,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        vision_config={
            "image_size": 32,
            "patch_size": 8,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
        },
        projection_dim=8,
    )
    path = tmp_path_factory.mktemp("tiny_clip")
    CLIPModel(config).eval().save_pretrained(path)
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(path)
    return str(path)


def _expected(model_dir: str, image: Image.Image, text: str) -> float:
    """CLIPScore computed independently of the reward code."""
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(model_dir).eval()
    proc = AutoProcessor.from_pretrained(model_dir)
    with torch.no_grad():
        pix = proc(images=[image], return_tensors="pt")["pixel_values"]
        img = model.get_image_features(pixel_values=pix).pooler_output[0]
        enc = proc.tokenizer([text], truncation=True, max_length=16, return_tensors="pt")
        txt = model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).pooler_output[0]
    cos = torch.nn.functional.cosine_similarity(img, txt, dim=0).item()
    return min(1.0, 2.5 * max(cos, 0.0))


def test_clip_consistency_on_tiny_random_clip(tiny_clip: str) -> None:
    from vlmrl.rewards import clip

    red = Image.new("RGB", (40, 30), (255, 0, 0))
    noise = Image.frombytes("RGB", (40, 30), bytes(range(256)) * 14 + bytes(range(16)))
    texts = ["<think>hmm</think> a red square", "blue dots everywhere " * 30]  # the second overflows 16 tokens
    kw = {"model_path": tiny_clip}
    scores = {}
    for image_name, image in (("red", red), ("noise", noise)):
        for text in texts:
            sample = RewardSample(response=text, prompt="", ground_truth="", images=[image], image_scales=[(1, 1)])
            got = clip.clip_consistency(sample, **kw)
            answer = text.split("</think>")[-1].strip()
            assert got == pytest.approx(_expected(tiny_clip, image, answer), abs=1e-5)
            assert 0.0 <= got <= 1.0
            scores[(image_name, text)] = got
    assert len(set(scores.values())) > 1  # the score depends on its inputs
    assert len(clip._MODELS) == 1  # loaded once, cached by path
    assert clip.clip_consistency(RewardSample("<think>x</think>", "", "", images=[red]), **kw) == 0.0
    with pytest.raises(ValueError, match="needs index 0"):
        clip.clip_consistency(RewardSample("red", "", ""), **kw)


def test_clip_consistency_through_the_manager(tiny_clip: str) -> None:
    red = Image.new("RGB", (40, 30), (255, 0, 0))
    comps = [{"function": "clip_consistency", "weight": 1.0, "kwargs": {"model_path": tiny_clip}}]
    with RewardManager(RewardConfig(components=comps), CustomRewardFunctionConfig()) as rm:
        assert rm.needs_images
        out = rm.score([RewardSample("a red square", "", "", images=[red]), RewardSample("a red square", "", "")])
    assert out.scores[0] == pytest.approx(_expected(tiny_clip, red, "a red square"), abs=1e-5)
    assert out.errors == [None, "exception"]
