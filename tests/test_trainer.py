"""The training loop in-process: ``vlmrl.trainer.grpo.fit`` / ``Trainer`` with one local hybrid worker
(``trainer.launcher=inline``) and the transformers rollout (``actor_rollout_ref.rollout.name=hf``): no Ray, no vLLM.

Tiny runs (4 prompts x 4 samples, 8-token responses, 1-3 steps) on the cached tiny Qwen2.5-VL and a small synthetic
colour/shape dataset. What the runs leave behind (metrics.jsonl, TensorBoard events, galleries, sample dumps,
checkpoints) and what the trainer holds afterwards (policy weights, sampler position) are checked against what the
configuration asked for. The subprocess runs of ``test_train_e2e.py`` cover learning, kill -9 resume, worker death and
export; nothing here repeats them.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from vlmrl.config import ConfigError, load
from vlmrl.trainer import checkpoint as ckpt
from vlmrl.trainer.grpo import Trainer, fit
from vlmrl.trainer.tracking import read_metrics

BS, N, MAX_RESP = 4, 4, 8
QUESTIONS = {"synthetic/colour": "What colour is the shape?", "synthetic/shape": "What shape is shown?"}
ANSWERS = {"synthetic/colour": {"red", "green", "blue"}, "synthetic/shape": {"circle", "square", "triangle"}}

REWARDS_PY = '''
def varied(data_source, solution_str, ground_truth, extra_info=None):
    """A score in [0, 1] that depends on the response text: groups of random responses almost never tie."""
    return (sum(map(ord, solution_str)) % 101) / 100.0


def constant(data_source, solution_str, ground_truth, extra_info=None):
    """Every sample scores the same: every group has zero variance."""
    return 0.5


def mixed(data_source, solution_str, ground_truth, extra_info=None):
    """Colour prompts score a constant (zero-variance groups); shape prompts score like varied."""
    if data_source == "synthetic/colour":
        return 0.5
    return varied(data_source, solution_str, ground_truth, extra_info)
'''


def varied(text: str) -> float:
    """The ``varied`` reward, recomputed here."""
    return (sum(map(ord, text)) % 101) / 100.0


# ------------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """preprocess/synthetic.py output: colour and shape families, 56 px images, 32 train / 8 test records."""
    from vlmrl.preprocess.synthetic import main as synthetic

    out = tmp_path_factory.mktemp("synth")
    synthetic(
        [
            "--output-dir",
            str(out),
            "--families",
            "colour,shape",
            "--image-size",
            "56",
            "--train-size",
            "32",
            "--test-size",
            "8",
            "--seed",
            "0",
            "--no-progress",
        ]
    )
    return out


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory) -> Path:
    """Custom reward functions (verl signature) loaded via custom_reward_function.path."""
    path = tmp_path_factory.mktemp("rewards") / "test_rewards.py"
    path.write_text(REWARDS_PY)
    return path


def make_cfg(model: str, data: Path, out: Path, *overrides: str):
    """tiny_cpu composed the way the CLI does, shrunk to a few-second in-process run (validation only where a test
    asks for it, no entropy bonus)."""
    return load(
        [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}",
            f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={out}",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            f"data.train_batch_size={BS}",
            f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={BS}",
            f"data.max_response_length={MAX_RESP}",
            "trainer.total_training_steps=2",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "actor_rollout_ref.actor.entropy_coeff=0",  # the plain GRPO loss: expected values are stated for it
            "trainer.logger=[jsonl]",
            *overrides,
        ],
        config_name="tiny_cpu",
    )


def reward_overrides(rewards_file: Path, name: str) -> list[str]:
    return [f"custom_reward_function.path={rewards_file}", f"custom_reward_function.name={name}"]


@contextlib.contextmanager
def trainer_of(cfg, train: bool = True) -> Iterator[Trainer]:
    """A Trainer (optionally after ``fit()``), closed afterwards like ``grpo.fit`` closes it."""
    t = Trainer(cfg)
    try:
        if train:
            t.fit()
        yield t
    finally:
        t.close()


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def engine_state(t: Trainer) -> dict[str, torch.Tensor]:
    """The policy's full weights under HF names (LoRA merged), as the worker pushes them to an engine."""
    return {k: v.detach().cpu().clone() for k, v in t.group.worker.policy.engine_weights()}


@pytest.fixture(scope="module")
def base_state(tiny_model_dir) -> dict[str, torch.Tensor]:
    """The untrained tiny model's weights."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()


def same_weights(a: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> list[str]:
    """Names of the tensors of ``a`` that equal the base model's (every name of ``a`` must exist in base)."""
    assert set(a) <= set(base), sorted(set(a) - set(base))[:5]
    return [k for k in a if torch.equal(a[k], base[k])]


def dumped(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (run_dir / f"step_{step:06d}.jsonl").read_text().splitlines()]


def groups_of(rows: list[dict]) -> list[list[dict]]:
    return [rows[i : i + N] for i in range(0, len(rows), N)]


# -------------------------------------------------------------------------------- 1-2. metrics, artifacts, dumps


TRAIN_KEYS = (
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "response_length/clip_ratio",
    "advantages/mean",
    "actor/grad_norm",
    "actor/pg_loss",
    "actor/entropy",
    "actor/lr",
    "rollout/logprob_diff",
    "timing/step_s",
    "timing/rollout_s",
    "timing/reward_s",
    "timing/train_s",
    "timing/update_s",
    "timing/push_s",
    "throughput/tokens_per_s",
    "training/epoch",
    "work/update_tokens",
    "work/update_padding_tokens",
    "work/update_vision_patches",
)
VAL_KEYS = ("val/reward/mean", "val/synthetic/colour/reward", "val/synthetic/shape/reward", "timing/validate_s")


@pytest.fixture(scope="module")
def basic_run(tiny_model_dir, data, rewards_file, tmp_path_factory) -> Path:
    """Two GRPO steps validating after each, with TensorBoard, a 3-sample gallery and sample dumps."""
    out = tmp_path_factory.mktemp("basic")
    cfg = make_cfg(
        tiny_model_dir,
        data,
        out,
        "trainer.test_freq=1",
        "trainer.logger=[jsonl,tensorboard]",
        "trainer.log_val_generations=3",
        f"trainer.rollout_data_dir={out / 'samples'}",
        *reward_overrides(rewards_file, "varied"),
    )
    last = fit(cfg)
    assert set(VAL_KEYS) <= set(last)  # fit returns the last step's metrics with its validation
    return out


def test_metrics_jsonl_one_line_per_step(basic_run):
    """metrics.jsonl has exactly one line per training step with the training, timing and (with test_freq=1)
    validation keys, all finite and in range; the update really ran (non-zero gradient, GRPO advantages centred)."""
    rows = read_metrics(basic_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        missing = [k for k in TRAIN_KEYS + VAL_KEYS if k not in r]
        assert not missing, (r["step"], missing)
        for k in TRAIN_KEYS + VAL_KEYS:
            assert isinstance(r[k], (int, float)) and math.isfinite(r[k]), (k, r[k])
        assert 0.0 <= r["reward/mean"] <= 1.0
        assert 0 < r["response_length/mean"] <= MAX_RESP
        assert r["timing/step_s"] > 0 and r["timing/push_s"] >= 0 and r["actor/grad_norm"] >= 0
        assert r["timing/step_s"] >= r["timing/rollout_s"]
        # what the update's forwards ran (both workers'): every real token of the batch's responses at least
        assert r["work/update_tokens"] >= r["response_length/mean"] * BS * N and r["work/update_padding_tokens"] >= 0
        assert r["advantages/mean"] == pytest.approx(0.0, abs=1e-5)  # GRPO: every group is centred
        assert "reward/score/mean" not in r  # one reward mean, the trained batch's
        assert r["actor/lr"] == pytest.approx(2e-3)  # tiny_cpu's lr, constant schedule
        # 4 validation records per family: the overall mean is the mean of the two per-source means
        per_source = (r["val/synthetic/colour/reward"] + r["val/synthetic/shape/reward"]) / 2
        assert r["val/reward/mean"] == pytest.approx(per_source, abs=1e-5)
    assert any(r["actor/grad_norm"] > 0 for r in rows), [r["actor/grad_norm"] for r in rows]
    assert any(r["reward/std"] > 0 for r in rows)


def test_validation_gallery_and_reward_curve(basic_run):
    """Each validation writes an HTML gallery of log_val_generations samples (images inlined); close() draws the
    reward curve PNG."""
    pages = sorted(p.name for p in (basic_run / "val_gallery").glob("*.html"))
    assert pages == ["step_000001.html", "step_000002.html"]
    html = (basic_run / "val_gallery" / "step_000002.html").read_text()
    assert html.count("<div class='card'>") == 3  # trainer.log_val_generations=3 of the 8 validation samples
    assert html.count('src="data:image/jpeg;base64,') == 3
    assert "synthetic/colour" in html or "synthetic/shape" in html
    png = basic_run / "reward_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_validation_gallery_header_summarises_all_samples(basic_run):
    """The gallery header counts every validation sample and shows their mean score (= val/reward/mean), while
    drawing only log_val_generations cards."""
    html = (basic_run / "val_gallery" / "step_000002.html").read_text()
    val = read_metrics(basic_run / "metrics.jsonl")[-1]["val/reward/mean"]
    assert "samples: 8 (showing 3)" in html
    assert f"mean score: <b class='mean'>{val:.4f}</b>" in html


def test_tensorboard_events_match_jsonl(basic_run):
    """trainer.logger=[..., tensorboard] writes an event file whose scalars are the metrics.jsonl values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((basic_run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(basic_run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reward/mean", "actor/grad_norm", "timing/step_s", "val/reward/mean"} <= tags, sorted(tags)
    rows = read_metrics(basic_run / "metrics.jsonl")
    for key in ("reward/mean", "actor/grad_norm", "val/reward/mean"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [1, 2]
        for e, r in zip(events, rows):
            assert e.value == pytest.approx(r[key], rel=1e-5, abs=1e-6), key


def test_rollout_data_dir_dumps_every_sample(basic_run):
    """trainer.rollout_data_dir gets one JSON line per sample per step: its prompt, response, ground truth, the score
    the reward function gives that response, and its GRPO advantage; the dump agrees with metrics.jsonl."""
    samples = basic_run / "samples"
    assert sorted(p.name for p in samples.iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
    metrics = {r["step"]: r for r in read_metrics(basic_run / "metrics.jsonl")}
    for step in (1, 2):
        rows = dumped(samples, step)
        assert len(rows) == BS * N
        for r in rows:
            assert {"step", "data_source", "prompt", "response", "ground_truth", "score", "advantage"} <= set(r)
            assert r["step"] == step
            assert QUESTIONS[r["data_source"]] in r["prompt"] and "<|vision_start|>" in r["prompt"]
            assert r["ground_truth"] in ANSWERS[r["data_source"]]
            assert r["score"] == pytest.approx(varied(r["response"]))
        for g in groups_of(rows):  # the n samples of a prompt are consecutive and share it
            assert len({(r["prompt"], r["ground_truth"], r["data_source"]) for r in g}) == 1
            scores = np.array([r["score"] for r in g])
            adv = np.array([r["advantage"] for r in g])
            assert adv.sum() == pytest.approx(0.0, abs=1e-5)
            for i in range(N):  # a higher score never gets a lower advantage
                for j in range(N):
                    if scores[i] > scores[j]:
                        assert adv[i] > adv[j], (scores, adv)
        assert np.mean([r["score"] for r in rows]) == pytest.approx(metrics[step]["reward/mean"], abs=1e-5)


# ----------------------------------------------------------------------------------------- 3. dynamic sampling


def test_filter_groups_all_constant_uses_every_batch_then_fills(tiny_model_dir, data, rewards_file, tmp_path):
    """filter_groups with a reward that ties inside every group: all max_num_gen_batches batches are rolled out
    (the sampler moved that far), nothing is kept, the batch is filled with zero-advantage groups and the step
    still trains (a full batch, zero gradient)."""
    cfg = make_cfg(
        tiny_model_dir,
        data,
        tmp_path / "run",
        "data.val_files=null",
        "trainer.total_training_steps=1",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=3",
        f"trainer.rollout_data_dir={tmp_path / 'samples'}",
        *reward_overrides(rewards_file, "constant"),
    )
    with trainer_of(cfg) as t:
        offset = t.sampler.state_dict()
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row["step"] == 1
    assert row["filter_groups/gen_batches"] == 3
    assert row["filter_groups/kept_ratio"] == 0.0
    assert row["filter_groups/filled"] == BS
    assert offset["offset"] == 3, offset  # three rollout batches were drawn from the sampler for this one step
    assert row["reward/mean"] == 0.5 and row["reward/std"] == 0.0
    assert row["advantages/abs_mean"] == 0.0 and row["actor/grad_norm"] == 0.0
    assert "actor/pg_loss" in row and "timing/push_s" in row
    rows = dumped(tmp_path / "samples", 1)
    assert len(rows) == BS * N and all(r["advantage"] == 0.0 for r in rows)


@pytest.fixture(scope="module")
def mixed_filter_run(tiny_model_dir, data, rewards_file, tmp_path_factory) -> dict:
    """Two steps of dynamic sampling where colour prompts tie (dropped) and shape prompts vary (kept)."""
    out = tmp_path_factory.mktemp("filter_mixed")
    cfg = make_cfg(
        tiny_model_dir,
        data,
        out / "run",
        "data.val_files=null",
        "trainer.total_training_steps=2",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=4",
        f"trainer.rollout_data_dir={out / 'samples'}",
        *reward_overrides(rewards_file, "mixed"),
    )
    with trainer_of(cfg) as t:
        drawn = t.sampler.state_dict()["offset"]
    return {"rows": read_metrics(out / "run" / "metrics.jsonl"), "samples": out / "samples", "drawn": drawn}


def test_filter_groups_keeps_varied_groups_first(mixed_filter_run):
    """filter_groups with colour prompts tied and shape prompts varied: gen_batches, kept_ratio and filled agree
    with each other and with the trained batch (kept groups = the varied ones, placed first; fillers tied)."""
    rows, samples, drawn = mixed_filter_run["rows"], mixed_filter_run["samples"], mixed_filter_run["drawn"]
    assert [r["step"] for r in rows] == [1, 2]
    total_batches = 0
    for r in rows:
        tries = r["filter_groups/gen_batches"]
        assert tries == int(tries) and 1 <= tries <= 4
        total_batches += int(tries)
        kept = r["filter_groups/kept_ratio"] * tries * BS
        assert kept == pytest.approx(round(kept), abs=1e-3), r["filter_groups/kept_ratio"]  # jsonl keeps 6 digits
        kept = round(kept)
        assert r["filter_groups/filled"] == max(0, BS - kept)
        assert kept >= BS or tries == 4  # stops early only when the batch is full
        groups = groups_of(dumped(samples, r["step"]))
        assert len(groups) == BS
        varied_flags = [np.std([s["score"] for s in g]) > 0 for g in groups]
        assert sum(varied_flags) == BS - r["filter_groups/filled"]
        assert varied_flags == sorted(varied_flags, reverse=True)  # kept (varied) groups come first
        for g, v in zip(groups, varied_flags):
            assert (g[0]["data_source"] == "synthetic/shape") == v
            if not v:
                assert all(s["advantage"] == 0.0 for s in g)
        assert np.mean([s["score"] for g in groups for s in g]) == pytest.approx(r["reward/mean"], abs=1e-5)
    assert drawn == total_batches  # the sampler advanced once per rollout batch
    assert any(r["actor/grad_norm"] > 0 for r in rows)


def test_filter_groups_reward_metrics_describe_the_trained_batch(mixed_filter_run):
    """With dynamic sampling the reward statistics describe the batch that was trained on (the dumped samples), not
    the batches rolled out."""
    rows = mixed_filter_run["rows"]
    assert any(r["filter_groups/gen_batches"] > 1 for r in rows)  # groups were gathered from several batches
    for r in rows:
        trained = [s["score"] for s in dumped(mixed_filter_run["samples"], r["step"])]
        assert r["reward/mean"] == pytest.approx(float(np.mean(trained)), abs=1e-5), r["step"]
        assert (r["reward/min"], r["reward/max"]) == (min(trained), max(trained))


# ------------------------------------------------------------------------------------------------------ 4. LoRA


def test_lora_trains_adapters_only_and_engine_gets_merged_weights(
    tiny_model_dir, tiny_processor, data, rewards_file, base_state, tmp_path
):
    """lora_rank=4: only adapter tensors train (base and vision weights stay bit-identical to the checkpoint),
    the adapters move, and the weights the worker pushes to an engine (LoRA merged under HF names) reproduce the
    trained policy exactly when loaded into a separate transformers model; the HF rollout generates with the
    adapted policy itself (engine/trainer log-prob gap ~0)."""
    from transformers import AutoModelForImageTextToText

    from vlmrl.models import qwen_vl
    from vlmrl.rollout.hf import HFRollout

    cfg = make_cfg(
        tiny_model_dir,
        data,
        tmp_path / "run",
        "data.val_files=null",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8",
        *reward_overrides(rewards_file, "varied"),
    )
    with trainer_of(cfg, train=False) as t:
        worker = t.group.worker
        model = worker.policy.model
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert trainable and all(qwen_vl.is_lora_param(n) for n in trainable), sorted(trainable)[:5]
        assert not any("visual" in n for n in trainable)
        before = {n: full(p) for n, p in model.named_parameters()}
        assert all(not before[n].any() for n in trainable if ".lora_B." in n)  # peft starts B at zero
        t.fit()
        rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
        after = {n: full(p) for n, p in model.named_parameters()}
        frozen_changed = [n for n in before if n not in trainable and not torch.equal(before[n], after[n])]
        assert not frozen_changed, frozen_changed[:5]
        moved = [n for n in trainable if not torch.equal(before[n], after[n])]
        assert len(moved) == len(trainable), sorted(set(trainable) - set(moved))[:5]
        pushed = engine_state(t)
        assert not any(qwen_vl.is_lora_param(k) for k in pushed)
        changed = set(pushed) - set(same_weights(pushed, base_state))
        assert changed and all(k.endswith("_proj.weight") and "language_model" in k for k in changed), sorted(changed)
        # the HF rollout generates with the trained module itself
        assert worker.engine.model is model
        # the pushed tensors, loaded into a separate model, give the policy's logits
        other = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        ids = tiny_processor.tokenizer("What colour is the shape? red green blue", return_tensors="pt").input_ids
        with torch.no_grad():
            before_push = other(input_ids=ids).logits
            HFRollout(other, tiny_processor).update_weights(worker.policy.engine_weights())
            want = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
            got = other(input_ids=ids).logits
    assert (before_push - want).abs().max() > 1e-4  # the adapters matter
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/logprob_diff"] < 1e-3 for r in rows), [r["rollout/logprob_diff"] for r in rows]
    assert any(r["actor/grad_norm"] > 0 for r in rows)


def lora_modules(model: torch.nn.Module) -> set[str]:
    """Names of the modules holding a LoRA adapter (peft's wrapper prefix and FSDP's names stripped)."""
    out = set()
    for name, _ in model.named_parameters():
        if ".lora_A." in name:
            out.add(name.split(".lora_A.")[0].removeprefix("base_model.model."))
    return out


def test_lora_exclude_modules_is_applied_as_peft_exclude_modules(
    tiny_model_dir, data, rewards_file, base_state, tmp_path
):
    """README: ``model.exclude_modules='.*visual.*'`` (LoRA leaves the vision tower out); another pattern is applied
    as peft's ``exclude_modules``. With ``.*language_model.layers.0.*`` the worker's model has adapters on all 7
    linears of language layer 1 and none on layer 0 (nor the vision tower); after two steps the merged weights it
    pushes have layer 0 exactly as the base model and layer 1's projections moved. ``.*visual.*`` leaves adapters on
    all 14 language linears and none in the vision tower."""
    linears = {
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    }
    lora = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8", "data.val_files=null")
    cfg = make_cfg(
        tiny_model_dir,
        data,
        tmp_path / "layer0",
        *lora,
        *reward_overrides(rewards_file, "varied"),
        "actor_rollout_ref.model.exclude_modules=.*language_model.layers.0.*",
    )
    with trainer_of(cfg, train=False) as t:
        wrapped = lora_modules(t.group.worker.policy.model)
        assert wrapped == {f"model.language_model.layers.1.{m}" for m in linears}, sorted(wrapped)
        t.fit()
        pushed = engine_state(t)
    layer0 = [k for k in pushed if ".language_model.layers.0." in k]
    layer1 = [f"model.language_model.layers.1.{m}.weight" for m in linears]
    assert len(layer0) >= 7 and same_weights({k: pushed[k] for k in layer0}, base_state) == layer0
    assert not same_weights({k: pushed[k] for k in layer1}, base_state), "layer 1's adapters trained"
    cfg = make_cfg(
        tiny_model_dir, data, tmp_path / "visual", *lora, "actor_rollout_ref.model.exclude_modules=.*visual.*"
    )
    with trainer_of(cfg, train=False) as t:
        wrapped = lora_modules(t.group.worker.policy.model)
    assert wrapped == {f"model.language_model.layers.{i}.{m}" for i in (0, 1) for m in linears}, sorted(wrapped)


def test_freeze_vision_tower_keeps_the_tower_exact_while_the_language_model_trains(
    tiny_model_dir, data, rewards_file, base_state, tmp_path
):
    """README: ``freeze_vision_tower=True`` freezes the vision tower in full fine-tuning (verl's key
    ``actor_rollout_ref.actor.freeze_vision_tower``). After two steps the weights the worker holds and the ones its
    checkpoint exports have every vision-tower tensor bit-identical to the base model while the language model's
    projections changed; the same run without the flag changes the tower (so the check can fail)."""
    from transformers import AutoModelForImageTextToText

    from vlmrl.export import export_checkpoint

    def run(name: str, *extra: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        out = tmp_path / name
        cfg = make_cfg(
            tiny_model_dir,
            data,
            out,
            "data.val_files=null",
            "trainer.save_freq=2",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            *reward_overrides(rewards_file, "varied"),
            *extra,
        )
        with trainer_of(cfg) as t:
            held = engine_state(t)
        export_checkpoint(out / "global_step_2", tmp_path / f"{name}_hf")
        saved = AutoModelForImageTextToText.from_pretrained(tmp_path / f"{name}_hf", dtype=torch.float32).state_dict()
        return held, saved

    def tower(state: dict[str, torch.Tensor]) -> list[str]:
        return [k for k in state if "visual" in k]

    held, saved = run("frozen", "actor_rollout_ref.actor.freeze_vision_tower=True")
    language = [k for k in held if "language_model" in k and k.endswith("_proj.weight")]
    for state in (held, saved):
        assert len(tower(state)) > 10 and same_weights({k: state[k] for k in tower(state)}, base_state) == tower(state)
        moved = set(language) - set(same_weights({k: state[k] for k in language}, base_state))
        assert len(moved) == len(language) == 14, sorted(set(language) - moved)
    held, saved = run("trained")
    for state in (held, saved):
        assert len(same_weights({k: state[k] for k in tower(state)}, base_state)) < len(tower(state)) // 2


# -------------------------------------------------------------------------------------------- 5. checkpoints


@pytest.fixture(scope="module")
def ckpt_run(tiny_model_dir, data, rewards_file, tmp_path_factory) -> dict:
    """Run A: 2 steps, a checkpoint every step, keep 1. A line for step 3 is then appended to metrics.jsonl (as a
    run killed after logging step 3 would leave). Run B: the same folder, 3 steps, resume_mode=auto."""
    out = tmp_path_factory.mktemp("ckpt")
    common = (
        "data.val_files=null",
        "trainer.save_freq=1",
        "trainer.max_ckpt_to_keep=1",
        f"trainer.rollout_data_dir={out / 'samples'}",
        *reward_overrides(rewards_file, "varied"),
    )
    fit(make_cfg(tiny_model_dir, data, out, "trainer.total_training_steps=2", *common))
    after_a = {
        "folders": sorted(p.name for p in out.glob("global_step_*")),
        "tracker": (out / ckpt.TRACKER_FILE).read_text(),
        "state": ckpt.read_trainer_state(out / "global_step_2"),
        "files": sorted(str(p.relative_to(out / "global_step_2")) for p in (out / "global_step_2").rglob("*")),
    }
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "reward/mean": -1.0, "stale": True}) + "\n")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fit(make_cfg(tiny_model_dir, data, out, "trainer.total_training_steps=3", *common))
    return {"out": out, "after_a": after_a, "stdout_b": buf.getvalue()}


def test_checkpoint_layout_and_retention(ckpt_run):
    """save_freq=1 with max_ckpt_to_keep=1 leaves only the newest global_step folder, complete (actor shards and
    metadata, per-rank extras, trainer state with the sampler position, config), and the tracker file names it."""
    a, out = ckpt_run["after_a"], ckpt_run["out"]
    assert a["folders"] == ["global_step_2"]
    assert a["tracker"].strip() == "2"
    assert a["state"]["step"] == 2 and a["state"]["world"] == 1
    assert a["state"]["sampler"]["offset"] == 2 and a["state"]["sampler"]["epoch"] == 0
    assert {"trainer_state.json", "config.yaml", "actor/.metadata", "actor/extra_rank0.json"} <= set(a["files"])
    assert any(f.startswith("actor/") and f.endswith(".distcp") for f in a["files"])
    assert sorted(p.name for p in out.glob("global_step_*")) == ["global_step_3"]
    assert (out / ckpt.TRACKER_FILE).read_text().strip() == "3"
    assert ckpt.find_resume(out) == out / "global_step_3"
    assert not list(out.glob("*.tmp"))


def test_resume_auto_continues_log_and_data_order(ckpt_run, data):
    """resume_mode=auto resumes at the checkpointed step: it says so, trains only step 3, replaces the stale step-3
    line in metrics.jsonl (steps 1..3, no duplicates) and continues the sampler where it stopped (the prompts of
    steps 1-3 are the sampler's first three batches)."""
    import pandas as pd

    from vlmrl.data import BatchSampler

    out = ckpt_run["out"]
    assert f"resumed from {out / 'global_step_2'} at step 2" in ckpt_run["stdout_b"]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "stale" not in rows[2] and rows[2]["reward/mean"] >= 0.0
    df = pd.read_parquet(data / "train.parquet", columns=["data_source", "reward_model"])
    assert len(df) == 32
    schedule = BatchSampler(32, BS, shuffle=True, seed=1).batches(0)
    for step in (1, 2, 3):
        want = [(df.data_source[i], str(df.reward_model[i]["ground_truth"])) for i in schedule[step - 1]]
        got = [(g[0]["data_source"], g[0]["ground_truth"]) for g in groups_of(dumped(out / "samples", step))]
        assert got == want, step


def test_resume_modes(ckpt_run, tiny_model_dir, data, base_state):
    """auto loads the newest checkpoint (trained weights, step 3); resume_path loads the named one; disable starts
    from the initial model at step 0; a resume_path that is missing, not a step folder, or unset is a ConfigError."""
    out = ckpt_run["out"]

    def cfg(*ov: str):
        return make_cfg(tiny_model_dir, data, out, "data.val_files=null", "trainer.total_training_steps=3", *ov)

    with trainer_of(cfg("trainer.resume_mode=disable"), train=False) as t:
        assert t.step == 0 and t.sampler.state_dict()["offset"] == 0
        w = engine_state(t)
        assert len(same_weights(w, base_state)) == len(w)
    with trainer_of(cfg("trainer.resume_mode=auto"), train=False) as t:
        assert t.step == 3 and t.sampler.state_dict()["offset"] == 3
        w = engine_state(t)
        assert len(same_weights(w, base_state)) < len(w) // 2  # trained for 3 steps
    with trainer_of(
        cfg("trainer.resume_mode=resume_path", f"trainer.resume_from_path={out / 'global_step_3'}"), train=False
    ) as t:
        assert t.step == 3
    for bad in (out / "global_step_9", out, out / "samples"):
        with pytest.raises(ConfigError, match="not a complete checkpoint"):
            Trainer(cfg("trainer.resume_mode=resume_path", f"trainer.resume_from_path={bad}"))
    with pytest.raises(ConfigError, match="needs trainer.resume_from_path"):
        Trainer(cfg("trainer.resume_mode=resume_path"))
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]  # none of this rewrote the log


@pytest.fixture(scope="module")
def fresh_run(ckpt_run, tiny_model_dir, data, tmp_path_factory) -> Path:
    """resume_mode=disable, one step saved with max_ckpt_to_keep=1, in a copy of ckpt_run's folder (which holds the
    older run's global_step_3 and metrics for steps 1-3)."""
    out = tmp_path_factory.mktemp("fresh") / "run"
    shutil.copytree(ckpt_run["out"], out)
    fit(
        make_cfg(
            tiny_model_dir,
            data,
            out,
            "data.val_files=null",
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
            "trainer.max_ckpt_to_keep=1",
            "trainer.resume_mode=disable",
        )
    )
    return out


def test_fresh_run_keeps_its_own_checkpoint(fresh_run):
    """resume_mode=disable in a folder holding an older run's global_step_3, saving with max_ckpt_to_keep=1: the
    checkpoint the new run just committed survives and the tracker file points at a complete checkpoint, so a later
    resume_mode=auto continues this run, not the stale one."""
    assert (fresh_run / ckpt.TRACKER_FILE).read_text().strip() == "1"
    assert ckpt.is_complete(fresh_run / "global_step_1")
    assert ckpt.find_resume(fresh_run) == fresh_run / "global_step_1"


def test_fresh_run_starts_a_fresh_log(fresh_run):
    """A run started with resume_mode=disable logs its own steps only: metrics.jsonl (and so the reward curve) is not
    the older run's steps followed by the new ones."""
    assert [r["step"] for r in read_metrics(fresh_run / "metrics.jsonl")] == [1]


# -------------------------------------------------------------------------------------------------- 6. val_only


@pytest.fixture(scope="module")
def val_only_run(tiny_model_dir, data, base_state, tmp_path_factory) -> dict:
    """trainer.val_only=true on the initial model."""
    out = tmp_path_factory.mktemp("val_only")
    cfg = make_cfg(tiny_model_dir, data, out, "trainer.val_only=true", "trainer.log_val_generations=2")
    t = Trainer(cfg)
    try:
        result = t.fit()
        step = t.step
        untouched = len(same_weights(engine_state(t), base_state))
        n_weights = len(engine_state(t))
    finally:
        t.close()
    return {"out": out, "result": result, "step": step, "untouched": untouched, "n_weights": n_weights}


def test_val_only_validates_without_training(val_only_run):
    """val_only returns the validation metrics (overall and per data_source), writes the step-0 gallery and trains
    nothing: step stays 0, no training line is logged, every weight equals the initial model's."""
    r, out = val_only_run["result"], val_only_run["out"]
    assert set(VAL_KEYS) <= set(r), sorted(r)
    assert 0.0 <= r["val/reward/mean"] <= 1.0
    assert not any(k.startswith(("actor/", "reward/", "timing/step")) for k in r), sorted(r)
    assert val_only_run["step"] == 0
    assert val_only_run["untouched"] == val_only_run["n_weights"]
    path = out / "metrics.jsonl"
    rows = read_metrics(path) if path.exists() else []
    assert not any("reward/mean" in row or "actor/grad_norm" in row for row in rows)
    html = (out / "val_gallery" / "step_000000.html").read_text()
    assert html.count("<div class='card'>") == 2
    assert not (out / "samples").exists() and not list(out.glob("global_step_*"))


def test_val_only_records_its_metrics(val_only_run):
    """val_only logs its validation metrics like any validation (verl logs them at the current step): metrics.jsonl
    gets a line with val/reward/mean equal to the returned value."""
    path = val_only_run["out"] / "metrics.jsonl"
    rows = read_metrics(path) if path.exists() else []
    vals = [row["val/reward/mean"] for row in rows if "val/reward/mean" in row]
    assert vals == [pytest.approx(val_only_run["result"]["val/reward/mean"], abs=1e-6)]


# ---------------------------------------------------------------------------------- 7. user advantage estimator


def test_user_advantage_estimator_from_file_drives_the_update(tiny_model_dir, data, tmp_path):
    """algorithm.adv_estimator=file.py:fn (verl's signature) is called once per step with the step's token rewards,
    response masks and prompt ids, and its output
    is what trains: a constant 0.25 advantage gives advantages/mean 0.25 and, on-policy with token-mean, a policy
    loss of exactly -0.25 and a non-zero gradient (GRPO on the untrained model's all-zero rewards would give none).
    Validation with log_val_generations=0 writes no gallery; without tensorboard in trainer.logger no event file."""
    calls = tmp_path / "calls.jsonl"
    est = tmp_path / "my_adv.py"
    est.write_text(
        "import json\nimport torch\n\n"
        "def quarter(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True,\n"
        "            config=None, **kw):\n"
        f"    with open({str(calls)!r}, 'a') as f:\n"
        "        f.write(json.dumps({'n': len(token_level_rewards), 'groups': len(set(index.tolist())),\n"
        "                            'lengths': [int(x) for x in response_mask.sum(-1)]}) + '\\n')\n"
        "    adv = 0.25 * response_mask\n"
        "    return adv, adv\n"
    )
    out = tmp_path / "run"
    cfg = make_cfg(tiny_model_dir, data, out, f"algorithm.adv_estimator={est}:quarter", "trainer.log_val_generations=0")
    last = fit(cfg)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    logged = [json.loads(x) for x in calls.read_text().splitlines()]
    assert len(logged) == 2 and all(c["n"] == BS * N and c["groups"] == BS for c in logged), logged
    assert all(1 <= n <= MAX_RESP for c in logged for n in c["lengths"])
    for r in rows:
        assert r["advantages/mean"] == pytest.approx(0.25) and r["advantages/abs_mean"] == pytest.approx(0.25)
        assert r["actor/pg_loss"] == pytest.approx(-0.25, abs=1e-6)
        assert r["actor/grad_norm"] > 0
    assert "val/reward/mean" in rows[-1] and "val/reward/mean" in last
    assert not (out / "val_gallery").exists()
    assert not (out / "tensorboard").exists()
