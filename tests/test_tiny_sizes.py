"""The model-size presets of ``vlmrl.testing.tiny`` (``SIZES``): sizes as named, shapes vLLM's CPU attention takes,
the tiny preset unchanged (same cache key), and the CLI's ``--size``. Parameters are counted on the meta device."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from vlmrl.testing import tiny
from vlmrl.testing.tiny import SIZES, TinySpec, param_counts, spec_overrides

# (lowest, highest) total parameters each name allows
RANGES = {"tiny": (1e5, 1e6), "20m": (15e6, 30e6), "100m": (80e6, 130e6)}


@pytest.fixture(scope="module")
def counts() -> dict[str, dict[str, int]]:
    return {name: param_counts(spec) for name, spec in SIZES.items()}


def test_presets_have_the_sizes_their_names_say(counts: dict[str, dict[str, int]]) -> None:
    assert set(SIZES) == set(RANGES)
    for name, c in counts.items():
        low, high = RANGES[name]
        assert low <= c["total"] <= high, (name, c)
        assert c["total"] == c["language_model"] + c["vision_tower"]
    # both towers grow together, and the parameters are in the transformer, not the (tiny-vocabulary) embeddings
    for small, big in (("tiny", "20m"), ("20m", "100m")):
        assert counts[big]["language_model"] > 3 * counts[small]["language_model"]
        assert counts[big]["vision_tower"] > 2 * counts[small]["vision_tower"]
    for name in ("20m", "100m"):
        c = counts[name]
        assert 0.05 < c["vision_tower"] / c["total"] < 0.4, (name, c)
        assert c["embedding"] < 0.02 * c["total"], (name, c)


def test_presets_fit_vllm_cpu_attention_and_the_tiny_tokenizer() -> None:
    for name, s in SIZES.items():
        assert s.hidden % s.heads == 0 and s.hidden // s.heads >= 32, name  # the language model's paged attention
        assert s.heads % s.kv_heads == 0, name
        assert s.vision_hidden % s.vision_heads == 0, name  # (the vision tower runs plain SDPA: the tiny one has 16)
        assert s.vocab_size == TinySpec().vocab_size and not s.model_vocab_size, name


def test_tiny_preset_is_the_default_model_and_overrides_round_trip() -> None:
    assert SIZES["tiny"] == TinySpec()  # so ensure_tiny_model(seed) and the "tiny" preset share one cached copy
    assert spec_overrides(SIZES["tiny"]) == {}
    for spec in SIZES.values():
        assert TinySpec(**spec_overrides(spec)) == spec


def test_cli_size_picks_the_preset_and_flags_override_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[TinySpec] = []

    def fake_build(output: str, seed: int, spec: TinySpec) -> Path:
        built.append(spec)
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "vlmrl_tiny.json").write_text(json.dumps({"spec": asdict(spec)}))
        return out

    monkeypatch.setattr(tiny, "build_tiny_model", fake_build)
    tiny.main(["--output", str(tmp_path / "a"), "--size", "20m"])
    tiny.main(["--output", str(tmp_path / "b"), "--size", "100m", "--layers", "3"])
    tiny.main(["--output", str(tmp_path / "c")])
    assert built[0] == SIZES["20m"]
    assert built[1] == TinySpec(**{**spec_overrides(SIZES["100m"]), "layers": 3})
    assert built[2] == TinySpec()
    assert json.loads(capsys.readouterr().out.splitlines()[0])["size"] == "20m"


def test_cli_builds_a_loadable_preset(tmp_path: Path) -> None:
    """The real build, on the tiny preset with one layer (seconds): the checkpoint has the counted parameters."""
    from vlmrl.models.value_head import checkpoint_params

    tiny.main(["--output", str(tmp_path), "--size", "tiny", "--layers", "1"])
    meta = json.loads((tmp_path / "vlmrl_tiny.json").read_text())
    assert meta["spec"]["layers"] == 1
    assert checkpoint_params(tmp_path) == param_counts(TinySpec(layers=1))["total"]
