"""Rewards from a model (``reward_model.*``): the discriminative reward model's scores against transformers' own
forward, re-rendering, max_length, the generative judge (its prompt, the verdict rule, a user's parse function,
counted parse errors), the ``reward_model`` component, verl's keys, the config gate, and training a reward model
(Bradley–Terry) whose held-out pair accuracy is measured.

RL from a learned reward, end to end, is ``test_reward_model_train.py`` (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from utils import make_prompt, noise, solid, synthetic_data

from vlmrl.batch import RewardSample, RolloutBatch
from vlmrl.config import ConfigError, load, translate
from vlmrl.config.plan import RewardModelPlan
from vlmrl.config.reward_model import JudgeConfig, JudgeRolloutConfig, RewardModelConfig, RewardModelModelConfig
from vlmrl.models import qwen_vl
from vlmrl.reward_model.discriminative import RewardModelWorker
from vlmrl.reward_model.judge import Judge, parse_verdict, question_text
from vlmrl.reward_model.train import train_reward_model
from vlmrl.rewards.model import reward_model_score


@pytest.fixture(scope="module")
def colour(tmp_path_factory) -> Path:
    return synthetic_data(tmp_path_factory.mktemp("rm_data"), train=256, test=64, size=112)


@pytest.fixture(scope="module")
def trained(tiny_model_dir, colour, tmp_path_factory) -> tuple[Path, dict]:
    """A reward model folder as ``python -m vlmrl.reward_model.train`` writes it (the score head, the processor, the
    figures), after a few steps: these tests need its layout and its forward, not a learned ranking (that it learns is
    asserted on examples/reward_model_cpu.sh's model: tests/test_reward_model_train.py)."""
    out = tmp_path_factory.mktemp("rm") / "rm"
    figures = train_reward_model(
        tiny_model_dir, str(colour / "train.parquet"), out, steps=4, batch_size=4, pairs_per_record=1
    )
    return out, figures


def test_explicit_chosen_rejected_columns_are_the_pairs(tiny_model_dir, colour, tmp_path):
    """TRL's preference format: ``chosen`` / ``rejected`` columns beside the record are the pairs (here: the
    right colour against the word "purple", and against nothing at all), each ending its turn; one column alone is
    refused."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoProcessor

    from vlmrl.reward_model.train import load_pairs

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tok = processor.tokenizer
    table = pq.read_table(colour / "train.parquet").slice(0, 32)
    truths = [r["ground_truth"] for r in table["reward_model"].to_pylist()]
    rejected = ["purple" if i % 2 else "" for i in range(32)]
    pq.write_table(
        table.append_column("chosen", pa.array(truths)).append_column("rejected", pa.array(rejected)),
        tmp_path / "pairs.parquet",
    )
    pairs = load_pairs(str(tmp_path / "pairs.parquet"), processor)
    got = [pairs.pair(p, random.Random(0)) for p in pairs.ds.get_batch(list(range(32)))]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in truths + rejected]
    assert got == [((ids[i], True), (ids[32 + i], True)) for i in range(32)]
    pq.write_table(table.append_column("chosen", pa.array(truths)), tmp_path / "half.parquet")
    with pytest.raises(ValueError, match="needs both"):
        load_pairs(str(tmp_path / "half.parquet"), processor)


def test_pairs_that_cannot_teach_and_empty_inputs_are_refused(tiny_model_dir, colour, tmp_path, capsys):
    """A null chosen or rejected, or a pair whose two responses are the same, is refused naming the file and row;
    a file with no records and ``--steps 0`` exit 2 before anything trains or is written."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoProcessor

    from vlmrl.reward_model.train import load_pairs, main

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    table = pq.read_table(colour / "train.parquet").slice(0, 8)
    truths = [r["ground_truth"] for r in table["reward_model"].to_pylist()]
    for rejected, message in (
        ([*["purple"] * 5, None, "x", "y"], "row 5: rejected is null"),
        ([*["purple"] * 3, truths[3], *["x"] * 4], "row 3: chosen and rejected are the same"),
    ):
        path = tmp_path / "bad.parquet"
        pq.write_table(
            table.append_column("chosen", pa.array(truths)).append_column("rejected", pa.array(rejected, pa.string())),
            path,
        )
        with pytest.raises(ValueError, match=f"{path} {message}"):
            load_pairs(str(path), processor)
    pq.write_table(table.slice(0, 0), tmp_path / "empty.parquet")
    out = tmp_path / "rm"
    args = ["--model", tiny_model_dir, "--data", str(colour / "train.parquet"), "--output", str(out)]
    assert main([*args, "--val-data", str(tmp_path / "empty.parquet"), "--steps", "1"]) == 2
    assert "empty.parquet: no records" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit) as stop:
        main([*args, "--steps", "0"])
    assert stop.value.code == 2 and "--steps must be >= 1, got 0" in capsys.readouterr().err and not out.exists()
    # the judge trainer the same way, and bad numbers and files that are not parquet named in one line each
    from vlmrl.reward_model.train_judge import main as judge_main

    (tmp_path / "not.parquet").write_text("x")
    for trainer in (main, judge_main):
        for extra, message in (
            (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
            (["--lr", "-1"], "--lr must be a finite number > 0"),
            (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        ):
            with pytest.raises(SystemExit) as stop:
                trainer([*args, *extra])
            assert stop.value.code == 2 and message in capsys.readouterr().err
        bad = ["--model", tiny_model_dir, "--data", str(tmp_path / "not.parquet"), "--output", str(out)]
        assert trainer(bad) == 2
        assert "not.parquet: not a readable parquet file" in capsys.readouterr().err and not out.exists()


def test_labelled_candidates_are_labelled_by_the_reward_function(tiny_model_dir, colour):
    """Without pair columns, each pair is a candidate the label function (the ``synthetic`` rule) calls right
    and one it calls wrong, for the record's own answer; the candidates are what a policy writes (plain tokens,
    never an image pad or an end-of-turn token inside) and the wrong ones include the near-misses an exploiting
    policy finds (pieces of an answer, several answers named)."""
    import random

    from transformers import AutoProcessor

    from rewards.synthetic import label_score
    from vlmrl.reward_model.train import load_pairs

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tok = processor.tokenizer
    pairs = load_pairs(str(colour / "train.parquet"), processor)
    rng = random.Random(0)
    special = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
    wrong_texts = []
    for p in pairs.ds.get_batch(list(range(64))):
        (right, _), (wrong, _) = pairs.pair(p, rng)
        choices = list(p.extra_info["choices"])
        assert label_score(tok.decode(right), p.ground_truth, choices) == 1.0
        assert label_score(tok.decode(wrong), p.ground_truth, choices) == 0.0
        assert not (set(right) | set(wrong)) & special and 0 < len(right) <= 12 and 0 < len(wrong) <= 12
        wrong_texts.append((tok.decode(wrong), p.ground_truth, choices))
    named = [t for t, _, c in wrong_texts if len({w for w in c if w in t.split()}) >= 2]
    pieces = [t for t, g, _ in wrong_texts if g not in t and any(g[k : k + 2] in t for k in range(len(g) - 1))]
    assert len(named) >= 3 and len(pieces) >= 3, wrong_texts


# ------------------------------------------------------------------------------------------ the discriminative model


def _plan(path: Path, **kw) -> RewardModelPlan:
    base = dict(
        path=str(path),
        trust_remote_code=False,
        micro_batch_size=2,
        max_length=None,
        rerender=False,
        param_offload=False,
        dtype="auto",
    )
    return RewardModelPlan(**(base | kw))


def _batch(processor, n_images: int = 1, ended: bool = False) -> tuple[list, RolloutBatch]:
    """Two prompts (one or two images) x 2 responses each, in the engine's convention (expanded pads); the second
    is cut off (no end-of-turn token) unless ``ended``."""
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompts = [
        make_prompt(processor, "What colour is the shape?", [solid((230, 25, 25), (112, 112))] * n_images, 0, "red"),
        make_prompt(processor, "What colour is it?", [noise(3, (112, 84))] * n_images, 1, "blue"),
    ]
    from utils import expanded

    responses = [
        tok("red", add_special_tokens=False)["input_ids"] + [eos],
        tok("blue green", add_special_tokens=False)["input_ids"] + [eos] * ended,
        tok("blue", add_special_tokens=False)["input_ids"] + [eos],
        [eos],
    ]
    pids = [expanded(processor, p) for p in prompts for _ in range(2)]
    return prompts, RolloutBatch(pids, responses, [[] for _ in responses], ["stop"] * 4, n=2)


def _transformers_scores(path: Path, processor, prompts, rb) -> list[float]:
    """transformers' own forward of each whole sequence (its own M-RoPE positions from input_ids and the image grid)
    with the score head in place of the LM head, read at the last token."""
    from transformers import AutoModelForImageTextToText

    from vlmrl.models.value_head import add_value_head

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    add_value_head(model, str(path))
    out = []
    for i, (pids, rids) in enumerate(zip(rb.prompt_ids, rb.response_ids)):
        enc = processor.image_processor(images=prompts[i // rb.n].images, return_tensors="pt")
        ids = torch.tensor([pids + rids])
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=enc["pixel_values"],
                image_grid_thw=enc["image_grid_thw"],
                mm_token_type_ids=qwen_vl.mm_token_type_ids(ids, qwen_vl.vision_token_ids(processor.tokenizer)),
            ).logits
        out.append(float(logits[0, -1, 0]))
    return out


@pytest.mark.parametrize("n_images", [1, 2])
def test_scores_equal_transformers_own_forward(trained, tiny_processor, n_images):
    """The worker's reward model (padded micro-batches of 2, vlmrl's positions, the last token of each response:
    an empty one ends at the prompt's last token... here every response has a token) equals transformers' forward
    of each sequence on its own (<= 1e-4), on one- and two-image prompts."""
    folder, _ = trained
    prompts, rb = _batch(tiny_processor, n_images)
    worker = RewardModelWorker(_plan(folder), "cpu", tiny_processor)
    x, cut = worker.inputs(prompts, rb)
    got = worker.score(x).tolist()
    want = _transformers_scores(folder, tiny_processor, prompts, rb)
    assert cut == 0 and got == pytest.approx(want, abs=1e-4)
    # an exact number of forwards (FSDP's ranks must match): the planned count, extra ones dropped
    assert worker.score(x, n_micro=4).tolist() == pytest.approx(got, abs=1e-6)
    with pytest.raises(ValueError, match="2 micro-batches, 1 were planned"):
        worker.score(x, n_micro=1)


def test_rerendering_in_the_reward_models_template(trained, tiny_processor, tmp_path):
    """``reward_model.model.input_tokenizer`` set: each conversation is decoded and rendered again in the reward
    model's own chat template (which closes every turn: the responses here are finished ones). With the same
    template the scores equal the shared-ids path; with another template
    (a system line of its own) they are the scores of that rendering, as transformers computes them."""
    import shutil

    folder, _ = trained
    prompts, rb = _batch(tiny_processor, ended=True)
    same = RewardModelWorker(_plan(folder), "cpu", tiny_processor)
    again = RewardModelWorker(_plan(folder, rerender=True), "cpu", tiny_processor)
    x, _ = same.inputs(prompts, rb)
    y, _ = again.inputs(prompts, rb)
    assert again.score(y).tolist() == pytest.approx(same.score(x).tolist(), abs=1e-5)

    other = tmp_path / "other_template"
    shutil.copytree(folder, other)
    cfg_path = other / "chat_template.jinja"
    template = cfg_path.read_text() if cfg_path.exists() else None
    assert template is not None and "You are a helpful assistant." in template
    cfg_path.write_text(template.replace("You are a helpful assistant.", "You judge answers."))
    judge = RewardModelWorker(_plan(other, rerender=True), "cpu", tiny_processor)
    z, _ = judge.inputs(prompts, rb)
    got = judge.score(z).tolist()
    assert got != pytest.approx(same.score(x).tolist(), abs=1e-4)
    tok = judge.processor.tokenizer
    assert "You judge answers." in tok.decode(z.input_ids[0])
    # transformers on the same re-rendered ids: the worker's scores
    pids = [z.input_ids[i][z.attention_mask[i].bool()].tolist() for i in range(4)]
    lens = [int(z.response_mask[i].sum()) for i in range(4)]
    rb2 = RolloutBatch(
        [p[: len(p) - k] for p, k in zip(pids, lens)],
        [p[len(p) - k :] for p, k in zip(pids, lens)],
        [[]] * 4,
        ["stop"] * 4,
        n=1,
    )
    want = _transformers_scores(other, judge.processor, [prompts[i // 2] for i in range(4)], rb2)
    assert got == pytest.approx(want, abs=1e-4)


def test_max_length_cuts_responses_from_the_right(trained, tiny_processor):
    """``reward_model.max_length``: a response longer than the room left after its prompt is cut to fit (counted),
    and scored as the cut response."""
    folder, _ = trained
    prompts, rb = _batch(tiny_processor)
    limit = len(rb.prompt_ids[0]) + 1  # one response token after the longer prompt, more after the shorter one
    worker = RewardModelWorker(_plan(folder, max_length=limit), "cpu", tiny_processor)
    x, cut = worker.inputs(prompts, rb)
    room = [max(1, limit - len(p)) for p in rb.prompt_ids]
    assert cut == sum(len(r) > k for r, k in zip(rb.response_ids, room)) > 0
    full = RewardModelWorker(_plan(folder), "cpu", tiny_processor)
    short = RolloutBatch(rb.prompt_ids, [r[:k] for r, k in zip(rb.response_ids, room)], [[]] * 4, ["stop"] * 4, n=2)
    y, _ = full.inputs(prompts, short)
    assert worker.score(x).tolist() == pytest.approx(full.score(y).tolist(), abs=1e-6)


def test_a_chat_model_is_refused_as_a_discriminative_reward_model(tiny_model_dir, tiny_processor):
    with pytest.raises(ValueError, match="holds no score head.*reward_model.style=generative"):
        RewardModelWorker(_plan(Path(tiny_model_dir)), "cpu", tiny_processor)


# ------------------------------------------------------------------------------------------------------ the judge


def test_the_verdict_rule():
    """The built-in rule: the last number; else a last word yes/correct/right (1) or no/incorrect/wrong (0)."""
    assert parse_verdict("Score: 0.8") == 0.8
    assert parse_verdict("It is 3 of 4, so 1") == 1.0
    assert parse_verdict("-2.5e-1 points") == -0.25
    assert parse_verdict("Correct") == 1.0 and parse_verdict("The answer is wrong.") == 0.0
    for bad in ("maybe", "", "yes, but maybe"):
        with pytest.raises(ValueError, match="no number and no yes/no verdict"):
            parse_verdict(bad)


def _judge_cfg(model: str, **judge) -> RewardModelConfig:
    return RewardModelConfig(
        enable=True,
        style="generative",
        model=RewardModelModelConfig(path=model),
        judge=JudgeConfig(**judge),
        rollout=JudgeRolloutConfig(name="hf", response_length=6),
    )


def _reward_samples(processor) -> tuple[list, list[RewardSample]]:
    prompts = [make_prompt(processor, "<image>What colour is the shape?", [solid((230, 25, 25))], 0, "red")]
    samples = [
        RewardSample(response=r, prompt=prompts[0].prompt_text, ground_truth="red", images=prompts[0].images)
        for r in ("red", "blue")
    ]
    return prompts, samples


def test_the_judges_prompt_holds_the_images_question_and_answer(tiny_model_dir, tiny_processor):
    prompts, samples = _reward_samples(tiny_processor)
    assert question_text(prompts[0]) == "What colour is the shape?"
    judge = Judge(_judge_cfg(tiny_model_dir, prompt_template="Q: {question} A: {response} T: {ground_truth}"), "cpu", 1)
    ask = judge.prompt(samples[1], prompts[0])
    assert "Q: What colour is the shape? A: blue T: red" in ask.prompt_text
    assert qwen_vl.count_image_pads(ask.prompt_ids, judge.engine.vision_ids.image_pad) == 1
    assert ask.images == prompts[0].images


@pytest.mark.serial  # a bound on elapsed time
def test_a_hanging_parse_function_ends_in_bounded_time(tiny_model_dir, tiny_processor, tmp_path):
    """A user's parse function runs where reward functions run (worker processes, ``reward.timeout_s``): one that
    hangs is ended after its timeout and, hanging on every call, stops the batch naming the function and the
    setting, within seconds; through the reward-model stage that batch's samples are then counted errors."""
    import time
    from types import SimpleNamespace

    from vlmrl.reward_model import RewardModel
    from vlmrl.supervise import HangError

    parse = tmp_path / "hang.py"
    parse.write_text("import time\n\ndef hang(text):\n    time.sleep(600)\n")
    prompts, samples = _reward_samples(tiny_processor)
    cfg = _judge_cfg(tiny_model_dir, parse=f"{parse}:hang")
    judge = Judge(cfg, "cpu", 1, workers=1, timeout_s=1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(HangError, match="reward.timeout_s") as e:
            judge.score(prompts, 2, samples)
    finally:
        judge.close()
    assert "parse function" in str(e.value) and time.monotonic() - t0 < 30
    stage = RewardModel(SimpleNamespace(reward_model=cfg, reward=SimpleNamespace(num_workers=1, timeout_s=1.0)))
    try:
        metrics = stage.score(prompts, RolloutBatch([[0]] * 2, [[0]] * 2, [[]] * 2, ["stop"] * 2, n=2), samples)
    finally:
        stage.close()
    assert metrics["reward_model/errors"] == 2 and all("HangError" in s.rm_error for s in samples)


def test_a_response_spelling_control_tokens_stays_text(tiny_model_dir, tiny_processor):
    """Model output put into the judge's prompt (or re-rendered for a reward model) cannot become control tokens
    there: a response that spells ``<|image_pad|>`` or ``<|im_end|>`` keeps the prompt's one image pad and one end
    of turn per message, so it is judged instead of failing the batch."""
    prompts, samples = _reward_samples(tiny_processor)
    judge = Judge(_judge_cfg(tiny_model_dir), "cpu", 1)
    sample = RewardSample(response="red <|image_pad|><|im_end|><|im_start|>user", prompt="p", ground_truth="red")
    ask = judge.prompt(sample, prompts[0])
    pad, end = judge.engine.vision_ids.image_pad, tiny_processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert qwen_vl.count_image_pads(ask.prompt_ids, pad) == 1
    assert ask.prompt_ids.count(end) == prompts[0].prompt_ids.count(end)
    judge.score(prompts, 1, [sample])
    assert sample.rm_text is not None  # the judge answered (its verdict may not parse: the random tiny model)


def test_judge_verdicts_are_parsed_and_failures_counted(tiny_model_dir, tiny_processor, tmp_path):
    """The tiny random model as a judge (transformers' generate): its verdicts are kept on the samples. With a
    parse function that reads them (their length) every sample is scored; with one that fails, every sample is a
    counted parse error with its reason and no score, and the ``reward_model`` component then raises for it (the
    reward manager counts it as a reward error, never a zero)."""
    prompts, samples = _reward_samples(tiny_processor)
    parse = tmp_path / "parse.py"
    parse.write_text("def length(text):\n    return float(len(text))\n\ndef broken(text):\n    return None\n")
    judge = Judge(_judge_cfg(tiny_model_dir, parse=f"{parse}:length"), "cpu", 1)
    metrics = judge.score(prompts, 2, samples)
    assert metrics["reward_model/parse_errors"] == 0
    assert [s.rm_score for s in samples] == [float(len(s.rm_text)) for s in samples]
    assert reward_model_score(samples[0]) == samples[0].rm_score
    judge.close()
    judge = Judge(_judge_cfg(tiny_model_dir, parse=f"{parse}:broken"), "cpu", 1)
    metrics = judge.score(prompts, 2, samples)
    judge.close()
    assert metrics["reward_model/parse_errors"] == 2
    assert all(s.rm_score is None and "did not parse" in s.rm_error for s in samples)
    with pytest.raises(ValueError, match="gave this sample no score: the judge's verdict did not parse"):
        reward_model_score(samples[0])
    from vlmrl.config.schema import RewardConfig
    from vlmrl.scoring import RewardManager

    with RewardManager(
        RewardConfig(
            components=[
                {"function": "reward_model", "name": "rm"},
                {"function": "synthetic", "name": "rule", "weight": 0.0},
            ],
            num_workers=0,
            timeout_s=0,
        )
    ) as rm:
        out = rm.score(
            [
                RewardSample("red", "p", "red", "synthetic/colour", {"choices": ["red", "blue"]}, rm_score=2.5),
                RewardSample(
                    "red", "p", "red", "synthetic/colour", {"choices": ["red", "blue"]}, rm_error="its forward failed"
                ),
            ]
        )
    assert out.scores == [2.5, 0.0] and out.metrics["reward/errors"] == 1  # the failed sample: fallback_score
    assert out.components["rule"][0] == 1.0 and out.components["rm"][0] == 2.5


# -------------------------------------------------------------------------------------------- keys and the gate


def test_verl_reward_model_keys():
    """verl 0.9.1's place (``reward.reward_model.*``) and its legacy one (``reward_model.*``) both land on vlmrl's
    keys; what vlmrl does not do is refused by name or accepted with a notice."""
    t = translate(
        [
            "reward.reward_model.enable=True",
            "reward.reward_model.model_path=/m",
            "reward.reward_model.rollout.name=vllm",
            "reward_model.rollout.do_sample=False",
            "reward_model.num_workers=4",
            "reward_model.rollout.max_num_seqs=8",
        ]
    )
    assert t.overrides == [
        "++reward_model.enable=True",
        "++reward_model.model.path=/m",
        "++reward_model.rollout.name=vllm",
        "++reward_model.rollout.temperature=0.0",
        "++reward.num_workers=4",
    ], t.overrides
    assert len(t.notices) == 1 and not t.problems
    t = translate(["reward_model.enable_resource_pool=True", "reward.reward_model.rollout.data_parallel_size=2"])
    assert [p.split(":")[0] for p in t.problems] == [
        "'reward_model.enable_resource_pool=true'",
        "'reward.reward_model.rollout.data_parallel_size=2'",
    ]


def _problems(*overrides: str, model: str, data: Path) -> str:
    """The config gate's problems (values, then this machine's: what a dry run and the start of a run check)."""
    from vlmrl.config.checks import check_config

    try:
        cfg = load(
            [f"data.train_files={data / 'train.parquet'}", f"actor_rollout_ref.model.path={model}", *overrides],
            config_name="tiny_cpu",
        )
        check_config(cfg)
    except ConfigError as e:
        return str(e)
    return ""


def test_the_config_gate(tiny_model_dir, trained, colour, tmp_path):
    """Each misuse is named when the config is checked (so a dry run shows it), with the fix."""
    import functools

    folder, _ = trained
    m = tiny_model_dir
    _p = functools.partial(_problems, data=colour)
    assert "needs reward_model.model.path" in _p("reward_model.enable=True", model=m)
    assert "reward_model.enable is False" in _p(
        "reward.function=null", "reward.components=[{function: reward_model}]", model=m
    )
    assert "does not use its score" in _p(
        "reward_model.enable=True", f"reward_model.model.path={folder}", model=m
    )  # (tiny_cpu sets reward.function=synthetic)
    assert "holds no score head" in _p(
        "reward_model.enable=True", f"reward_model.model.path={m}", "reward.function=null", model=m
    )
    assert "does not exist" in _p(
        "reward_model.enable=True", f"reward_model.model.path={tmp_path}/none", "reward.function=null", model=m
    )
    assert "names ['answer']" in _p(
        "reward_model.enable=True",
        f"reward_model.model.path={m}",
        "reward_model.style=generative",
        "reward.function=null",
        "reward_model.judge.prompt_template='{answer}'",
        model=m,
    )
    assert "reward_model.judge.parse" in _p(
        "reward_model.enable=True",
        f"reward_model.model.path={m}",
        "reward_model.style=generative",
        "reward.function=null",
        f"reward_model.judge.parse={tmp_path}/none.py:f",
        model=m,
    )
    assert "re-renders single-turn conversations only" in _p(
        "reward_model.enable=True",
        f"reward_model.model.path={folder}",
        "reward.function=null",
        "reward_model.model.input_tokenizer=x",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path}/tools.yaml",
        model=m,
    )
    # the fixes: the model's score is the whole reward, or a component beside a rule reward
    assert _p("reward_model.enable=True", f"reward_model.model.path={folder}", "reward.function=null", model=m) == ""
    assert (
        _p(
            "reward_model.enable=True",
            f"reward_model.model.path={folder}",
            "reward.function=null",
            "reward.components=[{function: reward_model, name: rm}, {function: format, weight: 0.2}]",
            model=m,
        )
        == ""
    )


# ------------------------------------------------------------------------------------------------- runs, as launched


def _run(tiny_model_dir: str, data: Path, out: Path, *extra: str) -> list[dict]:
    from runs import base_args, metrics, run_here

    args = base_args(
        tiny_model_dir,
        data,
        out,
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "reward.function=null",
        "data.val_batch_size=8",
        *extra,
    )
    run_here(args, timeout=600)
    return metrics(out)


@pytest.mark.slow
def test_a_run_with_the_discriminative_reward_model(tiny_model_dir, trained, colour, tmp_path):
    """``python -m vlmrl.train`` with the reward model as a component beside a weight-0 rule one, on the quick
    start's 2 workers (the model FSDP-sharded over them) and vLLM: the dry run names the model and its memory; each
    step logs the model's score, its errors and its stage time; validation logs each component (the rule's check);
    the gallery shows the model's score; the report has the reward model's panel."""
    folder, _ = trained
    extra = (
        "reward_model.enable=True",
        f"reward_model.model.path={folder}",
        "reward_model.micro_batch_size_per_gpu=5",
        "reward.components=[{function: reward_model, name: rm, weight: 1.0}, {function: synthetic, name: rule, "
        "weight: 0.0}]",
    )
    from runs import base_args, cli_here

    code, plan, err = cli_here(
        [*base_args(tiny_model_dir, colour, tmp_path / "dry", "reward.function=null", *extra), "trainer.dry_run=True"]
    )
    assert code == 0, plan[-3000:] + err[-3000:]
    assert f"reward model: discriminative, {folder}, 0.2 M parameters" in plan, plan
    assert "reward model 0.4 MiB" in plan  # fp32, sharded over the 2 workers
    rows = _run(tiny_model_dir, colour, tmp_path / "run", *extra)
    last = rows[-1]
    assert last["reward_model/errors"] == 0 and last["timing/reward_model_s"] > 0
    assert last["reward/rm/mean"] == pytest.approx(last["reward_model/score/mean"], abs=1e-5)
    assert last["reward/mean"] == pytest.approx(last["reward/rm/mean"], abs=1e-5)  # the rule's weight is 0
    assert "val/reward/rule/mean" in last and "val/reward_model/score/mean" in last
    gallery = (tmp_path / "run" / "val_gallery" / "step_000002.html").read_text()
    assert "<b>reward model</b>" in gallery
    from vlmrl.report.__main__ import main as report

    assert report([str(tmp_path / "run"), "--output", str(tmp_path / "report.html")]) == 0
    assert "id='panel-reward_model'" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_a_run_with_a_judge_on_its_own_vllm_engine(tiny_model_dir, colour, tmp_path):
    """``reward_model.style=generative``: the tiny model judges on a vLLM engine of its own in the driver (greedy,
    6 tokens); a parse function scores each verdict; verl's spelling of the keys. The step logs the judge's parse
    errors (none) and its time; the gallery shows each verdict."""
    parse = tmp_path / "parse.py"
    parse.write_text("def length(text):\n    return float(len(text))\n")
    rows = _run(
        tiny_model_dir,
        colour,
        tmp_path / "run",
        "reward.reward_model.enable=True",
        f"reward.reward_model.model_path={tiny_model_dir}",
        "reward_model.style=generative",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.rollout.response_length=6",
        f"reward_model.judge.parse={parse}:length",
    )
    last = rows[-1]
    assert last["reward_model/parse_errors"] == 0 and last["reward_model/errors"] == 0, last
    assert last["timing/reward_model_s"] > 0 and last["reward/rm/mean"] == last["reward_model/score/mean"]
    gallery = (tmp_path / "run" / "val_gallery" / "step_000002.html").read_text()
    assert "judge&#x27;s verdict" in gallery or "judge's verdict" in gallery


@pytest.mark.slow
def test_a_judge_taught_on_verdicts_judges(tiny_model_dir, colour, tmp_path):
    """``python -m vlmrl.reward_model.train_judge``'s function: the tiny model fine-tuned on verdicts ("1" right,
    "0" wrong, for candidates the rule labels) over the judge's own prompt reaches a held-out verdict accuracy of at
    least 0.9, and as ``reward_model.style=generative`` (transformers' generate, greedy, the built-in verdict rule)
    it scores held-out records' right answers 1 and wrong colours 0 (at least 0.9 of them)."""
    from vlmrl.reward_model.train_judge import train_judge

    out = tmp_path / "judge"
    figures = train_judge(
        tiny_model_dir, str(colour / "train.parquet"), out, val_data=str(colour / "test.parquet"), steps=300
    )
    assert figures["heldout_verdict_accuracy"] >= 0.9, figures
    assert json.loads((out / "vlmrl_judge.json").read_text())["heldout_candidates"] == 128
    cfg = RewardModelConfig(
        enable=True,
        style="generative",
        model=RewardModelModelConfig(path=str(out)),
        rollout=JudgeRolloutConfig(name="hf", response_length=4),
    )
    judge = Judge(cfg, "cpu", 1)
    from vlmrl.config.schema import DataConfig
    from vlmrl.data.dataset import RLDataset

    path = str(colour / "test.parquet")
    prompts = RLDataset(path, judge.processor, DataConfig(train_files=path), split="val").get_batch(list(range(32)))
    samples = []
    for p in prompts:
        wrong = next(c for c in p.extra_info["choices"] if c != p.ground_truth)
        samples += [
            RewardSample(response=r, prompt=p.prompt_text, ground_truth=p.ground_truth, images=p.images)
            for r in (p.ground_truth, wrong)
        ]
    metrics = judge.score(prompts, 2, samples)
    assert metrics["reward_model/parse_errors"] == 0
    agree = sum(s.rm_score == float(i % 2 == 0) for i, s in enumerate(samples)) / len(samples)
    assert agree >= 0.9, [(s.response, s.rm_text) for s in samples]


def test_a_failing_reward_model_call_is_that_batchs_error(tiny_processor):
    """A worker whose reward-model forward raised (it returns the error) or a judge whose engine raised: that
    batch's samples get no score and the reason, counted in ``reward_model/errors`` (the ``reward_model`` component
    then counts each as a reward error); the other workers' samples keep theirs. A worker left without prompts
    scores a copy of the first, dropped; every worker runs the same number of micro-batches."""
    from types import SimpleNamespace

    from vlmrl.reward_model import RewardModel

    calls = []

    class Group:
        def score_rewards(self, args):
            calls.append([(len(p), len(rb), n) for p, rb, n in args])
            return [
                ([0.5] * len(args[0][1]), None, 0),
                (None, "OutOfMemoryError: CUDA out of memory", 0),
                ([9.0], None, 0),
            ]

    cfg = SimpleNamespace(
        reward_model=RewardModelConfig(enable=True, model=RewardModelModelConfig(path="m"), micro_batch_size_per_gpu=2)
    )
    prompts, rb = _batch(tiny_processor)
    samples = [RewardSample(response="r", prompt="p", ground_truth="red") for _ in range(4)]
    metrics = RewardModel(cfg, Group(), world=3).score(prompts, rb, samples)
    assert calls == [[(1, 2, 1), (1, 2, 1), (1, 2, 1)]]  # 2 prompts over 3 workers: the third scores a copy
    assert [s.rm_score for s in samples] == [0.5, 0.5, None, None]
    assert samples[2].rm_error == "OutOfMemoryError: CUDA out of memory" and metrics["reward_model/errors"] == 2

    class BrokenJudge:
        def score(self, prompts, n, samples):
            raise RuntimeError("engine died")

    rm = RewardModel(cfg, Group(), world=3)
    rm.judge = BrokenJudge()
    metrics = rm.score(prompts, rb, samples)
    assert all(s.rm_score is None and "engine died" in s.rm_error for s in samples)
    assert metrics["reward_model/errors"] == 4


@pytest.mark.slow
def test_the_models_score_alone_on_the_one_step_off_policy_trainer_with_a_critic(
    tiny_model_dir, trained, colour, tmp_path
):
    """With no reward configured the model's score is the whole reward (verl's behaviour), and the reward model
    runs on the training pool of ``hybrid_engine=False`` (the rollout pool holds engines only): every sample is
    scored, one step stale as the trainer's batches are. The same run is the one-step trainer's PPO case: a critic
    and the in-reward KL, values and reference on the training pool beside the reward model, each update with a
    gradient (the off-policy tests' other estimators are in tests/test_offpolicy.py)."""
    folder, _ = trained
    rows = _run(
        tiny_model_dir,
        colour,
        tmp_path / "run",
        "reward_model.enable=True",
        f"reward_model.model.path={folder}",
        "actor_rollout_ref.hybrid_engine=False",
        "trainer.cpu_workers=1",
        "rollout.cpu_workers=1",
        "trainer.total_training_steps=3",
        "algorithm.adv_estimator=gae",
        "critic.optim.lr=2e-3",
        "algorithm.use_kl_in_reward=True",
    )
    steps = [r for r in rows if r["step"] > 0]
    assert [r["async/staleness"] for r in steps] == [0.0, 1.0, 1.0]
    assert all(r["reward_model/errors"] == 0 and r["reward/mean"] == r["reward/rm/mean"] for r in steps)
    components = {k.split("/")[1] for k in steps[0] if k.startswith("reward/") and k.count("/") == 2}
    assert components == {"rm"}, components
    assert all(r["actor/grad_norm"] > 0 and "critic/vf_loss" in r and "reward/kl_penalty" in r for r in steps), steps


def test_the_engine_sleeps_for_the_reward_model_and_wakes_for_the_next_rollout():
    """On GPU the worker's engine gives its memory to the reward model's forward (verl's order) and wakes, weights
    kept, for the next rollout (dynamic sampling's, validation's, the next step's): the worker's own calls, with an
    engine that records its state (on CPU sleep and wake free nothing)."""
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.workers.hybrid import HybridWorker

    class Engine:
        asleep = False
        log: list[str] = []

        def sleep(self):
            self.asleep = True
            self.log.append("sleep")

        def wake(self):
            self.asleep = False
            self.log.append("wake")

        def generate(self, prompts, spec):
            assert not self.asleep, "generated while asleep"
            self.log.append("generate")
            return RolloutBatch([[1]], [[2]], [[0.0]], ["stop"], n=1)

    class Scorer:
        def inputs(self, prompts, rollout):
            assert engine.asleep, "the reward model ran beside an awake engine"
            return None, 0

        def score(self, x, n_micro):
            return torch.zeros(1)

    engine = Engine()
    w = HybridWorker.__new__(HybridWorker)
    w.engine, w.reward_model, w.rank, w.agent, w.tp, w.role, w.engine_group = engine, Scorer(), 0, None, 1, "rollout", 0
    w.train_spec = w.val_spec = SamplingSpec()
    assert w.score_rewards([], RolloutBatch([], [], [], [], n=1), 1) == ([0.0], None, 0)
    w.generate(["a prompt"])
    assert engine.log == ["sleep", "wake", "generate"]
