"""RewardManager: selection, both signatures, composite weights and gates, error isolation, timeouts, the pool."""

from __future__ import annotations

import logging
import math
import textwrap
import time
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from vlmrl.batch import RewardSample
from vlmrl.config import CustomRewardFunctionConfig, RewardConfig
from vlmrl.scoring import (
    RewardConfigError,
    RewardError,
    RewardManager,
    ScoredPart,
    make_reward_fn,
    registered_names,
)

pytestmark = pytest.mark.serial  # runs alone in a parallel suite: reward timeouts of 0.5-1 s and bounds on elapsed time

REPO = Path(__file__).resolve().parents[1]

ZOO = '''
import math, os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    """verl-style: exact match plus a bonus; extra entries (even strings) ride along."""
    hit = 1.0 if solution_str.strip() == str(ground_truth) else 0.0
    return {"score": hit + bonus, "acc": hit, "split": (extra_info or {}).get("split", "?"), "pred": solution_str}

def positional(data_source, predict_str, ground_truth):
    return 1.0 if predict_str == ground_truth else 0.0

def vl(sample):
    """vlmrl-style: behaves as its response says."""
    r = sample.response
    if r == "nan":
        return math.nan
    if r == "inf":
        return {"score": 1.0, "part": math.inf}
    if r == "str":
        return "oops"
    if r == "none":
        return None
    if r == "nodict":
        return {"acc": 1.0}
    if r == "raise":
        raise ZeroDivisionError("boom")
    if r == "hang":
        while True:
            pass
    if r == "swallow":
        while True:
            try:
                time.sleep(0.01)
            except Exception:
                pass
    if r == "sleep":
        time.sleep(60)
    if r == "die":
        os._exit(3)
    if r == "exit":
        import sys
        sys.exit(3)
    if r == "socket":  # a read that never returns: no data will ever come
        import socket
        a, b = socket.socketpair()
        a.recv(1)
    if r == "huge_int":
        return 10 ** 400
    if r == "huge_float":
        return 1e39  # finite in float64, inf in float32 (the advantages' dtype)
    if r in ("subpool", "subpool_hang"):  # as verl's math_verify reward does: a process pool of its own
        import concurrent.futures, multiprocessing
        global _SUB
        _SUB = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        pid = _SUB.submit(os.getpid).result()
        with open(sample.extra_info["pids"], "a") as f:
            f.write(f"{r} {pid}\\n")
        if r == "subpool_hang":
            time.sleep(60)
        return 1.0
    if r == "index":
        time.sleep(0.002 * (sample.extra_info["i"] % 3))
        return float(sample.extra_info["i"])
    return float(len(r))

def n_images(sample):
    return float(len(sample.images))

def n_images_blind(sample):
    return float(len(sample.images))
n_images_blind.needs_images = False

def two_required(answer, truth):
    """verl's reward modules' form (compute_score(predict_str, ground_truth)): called fn(response, ground_truth)."""
    return 1.0 if answer == truth else 0.0

def no_params():
    return 0.0

def needs_more(solution_str, ground_truth, tokenizer):
    return 0.0

def only_solution(solution_str, ground_truth):
    """verl's keyword names without data_source / extra_info: called by keyword with just these two."""
    return 1.0 if solution_str == ground_truth else 0.0

async def async_reward(data_source, solution_str, ground_truth, extra_info=None):
    return 2.0 if solution_str == ground_truth else 0.5

def kw_only(**kwargs):
    return float(sorted(kwargs) == ["data_source", "extra_info", "ground_truth", "solution_str"])

def easyr1(reward_inputs):
    return [0.0 for _ in reward_inputs]
'''


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("zoo") / "zoo_rewards.py"
    path.write_text(textwrap.dedent(ZOO))
    return str(path)


def S(response: str, gt: object = "", ds: str = "test", **kw: object) -> RewardSample:
    return RewardSample(response=response, prompt="p", ground_truth=gt, data_source=ds, **kw)  # type: ignore[arg-type]


def manager(path: str | None = None, name: str = "compute_score", kwargs: dict | None = None, **reward: object):
    return RewardManager(
        RewardConfig(**reward), CustomRewardFunctionConfig(path=path, name=name, reward_kwargs=kwargs or {})
    )


# ------------------------------------------------------------------------------------------------------ selection


def test_verl_style_file_with_kwargs_and_extra_info(zoo: str) -> None:
    with manager(zoo, "compute_score", {"bonus": 0.5}) as rm:
        out = rm.score([S("42", "42", extra_info={"split": "train"}), S("41", "42")])
    assert out.scores == [1.5, 0.5]
    assert out.components == {"acc": [1.0, 0.0]}  # strings are dropped
    assert out.errors == [None, None]
    assert out.metrics["reward/acc/mean"] == 0.5 and out.metrics["reward/errors"] == 0.0
    assert rm.needs_images is False


def test_verl_positional_signature_and_vlmrl_detection(zoo: str) -> None:
    with manager(zoo, "positional") as rm:
        assert rm.score([S("a", "a"), S("a", "b")]).scores == [1.0, 0.0]
    with manager(zoo, "vl") as rm:
        assert rm.score([S("abc")]).scores == [3.0]
        assert rm.needs_images is True
    with manager(zoo, "two_required") as rm:
        assert rm.score([S("a", "a"), S("a", "b")]).scores == [1.0, 0.0]
    with pytest.raises(RewardConfigError, match="expected vlmrl's fn"):
        manager(zoo, "no_params")
    with pytest.raises(RewardConfigError, match="looks like an EasyR1 reward"):
        manager(zoo, "easyr1")


def test_verl_keyword_calls_pass_only_what_the_function_accepts(zoo: str) -> None:
    """verl calls reward functions by keyword; ``compute_score(solution_str, ground_truth)`` (the form of several of
    verl's own modules) must get the response and the answer, not shifted positional arguments."""
    with manager(zoo, "only_solution") as rm:
        out = rm.score([S("42", "42"), S("41", "42")])
    assert out.scores == [1.0, 0.0] and out.errors == [None, None]
    with manager(zoo, "async_reward") as rm:  # verl awaits coroutine reward functions
        assert rm.score([S("x", "x"), S("x", "y")]).scores == [2.0, 0.5]
    with manager(zoo, "kw_only") as rm:  # **kwargs: all four of verl's names
        assert rm.score([S("x", "x")]).scores == [1.0]
    with pytest.raises(RewardConfigError, match="cannot be called the way vlmrl calls verl-style"):
        manager(zoo, "needs_more")  # a required parameter vlmrl never passes: refused at start-up, not per sample


def test_a_step_where_every_reward_call_fails_stops_the_run(zoo: str) -> None:
    """on_error=fallback isolates a few failures, but a batch where every call failed (a broken reward) stops with the
    first error and its traceback instead of training on fallback scores; ``max_failed_ratio`` lowers the bar."""
    with manager(function=f"{zoo}:vl") as rm:
        out = rm.score([S("raise"), S("abc")])
        assert out.scores == [0.0, 3.0] and out.errors == ["exception", None]
        with pytest.raises(RewardError, match=r"ZeroDivisionError: boom\nTraceback") as e:
            rm.score([S("raise"), S("raise")])
        assert "2 of 2 samples" in str(e.value) and "max_failed_ratio=1" in str(e.value)
    with manager(function=f"{zoo}:vl", max_failed_ratio=0.5) as rm:
        with pytest.raises(RewardError, match="1 of 2 samples"):
            rm.score([S("raise"), S("abc")])
    with pytest.raises(RewardConfigError, match="max_failed_ratio"):
        manager(function=f"{zoo}:vl", max_failed_ratio=0.0)


@pytest.mark.parametrize("workers", [0, 1])
def test_groups_scored_apart_then_assembled_equal_the_batch_scored_at_once(zoo: str, workers: int) -> None:
    """What the fully asynchronous Rollouter does: each group's calls as it finishes (``outcomes``), the verdict over
    the step's whole batch (``assemble``): the same scores, components, errors and metrics as ``score`` of the batch,
    and failures judged against the batch's size, not the group's."""
    groups = [[S("raise"), S("raise")], [S("abc"), S("nan")], [S("ab"), S("xyz")]]
    batch = [s for g in groups for s in g]
    limits = {"num_workers": workers, "timeout_s": 30.0 if workers else 0.0}
    with manager(function=f"{zoo}:vl", max_failed_ratio=0.75, **limits) as rm:
        whole = rm.score(batch)
        with pytest.raises(RewardError, match="2 of 2 samples"):
            rm.score(groups[0])  # alone, the first group's failures would stop the run
        parts = [rm.outcomes(g) for g in groups]
        done = ScoredPart.concat(parts)
        assert done.samples == batch and done.seconds == sum(p.seconds for p in parts)
        out = rm.assemble(done.samples, done.outcomes, done.seconds)
    assert (
        out.scores == whole.scores
        and out.errors == whole.errors == ["exception"] * 2 + [None, "non_finite"] + [None] * 2
    )
    assert out.components.keys() == whole.components.keys()
    drop = {"reward/time_s"}
    assert {k: v for k, v in out.metrics.items() if k not in drop} == {
        k: v for k, v in whole.metrics.items() if k not in drop
    }
    with manager(function=f"{zoo}:vl", max_failed_ratio=0.5, **limits) as rm:
        done = ScoredPart.concat([rm.outcomes(g) for g in groups])
        with pytest.raises(RewardError, match="3 of 6 samples"):
            rm.assemble(done.samples, done.outcomes, done.seconds)


def test_function_by_registry_name_and_by_file_spec(zoo: str) -> None:
    with manager(None, kwargs={"mode": "rouge_l"}, function="similarity") as rm:
        out = rm.score([S("red circle on the left", "circle on left")])
    assert out.scores == [pytest.approx(6 / 7)]
    with manager(function=f"{zoo}:vl") as rm:
        assert rm.score([S("abcd")]).scores == [4.0]


def test_configuration_errors_are_raised_at_construction(zoo: str, tmp_path: Path) -> None:
    with pytest.raises(RewardConfigError, match="similarity"):
        manager(function="no_such_reward")
    with pytest.raises(RewardConfigError, match=r"reward file '.*missing.py' does not exist"):
        manager(str(tmp_path / "missing.py"))
    with pytest.raises(RewardConfigError, match="has no function 'nope'.*compute_score"):
        manager(zoo, "nope")
    with pytest.raises(RewardConfigError, match="does not accept kwargs"):
        manager(None, kwargs={"mood": "f1"}, function="similarity")
    with pytest.raises(RewardConfigError, match="does not accept keyword 'alpha'"):
        manager(zoo, "compute_score", {"alpha": 1})
    with pytest.raises(RewardConfigError, match="on_error"):
        manager(function="format", on_error="ignore")
    assert {"format", "accuracy", "geo3k", "synthetic", "clip_consistency", "text_visual"} <= set(registered_names())


def test_default_dispatch_and_unknown_source() -> None:
    with manager() as rm:
        out = rm.score(
            [
                S("<think>t</think>\\boxed{3}", "3", "hiyouga/geometry3k"),
                S("red", "red", "synthetic/colour", extra_info={"choices": ["red", "blue"]}),
            ]
        )
        assert out.scores == [1.0, 1.0]
        assert out.components["accuracy"][0] == 1.0 and math.isnan(out.components["accuracy"][1])
        assert out.metrics["reward/source/hiyouga/geometry3k/mean"] == 1.0
        with pytest.raises(RewardConfigError, match="custom_reward_function.path=.*registered name"):
            rm.score([S("x", "x", "my/dataset")])


def test_dispatch_table_with_globs(zoo: str) -> None:
    dispatch = {"exact/src": "format", "vqa/*": {"function": "similarity", "kwargs": {"mode": "exact"}}}
    with manager(zoo, "vl", dispatch=dispatch) as rm:
        out = rm.score([S("<think>a</think>\\boxed{1}", "", "exact/src"), S("Cat.", "cat", "vqa/x"), S("abc")])
    assert out.scores == [1.0, 1.0, 3.0]


# -------------------------------------------------------------------------------------------------------- composite


def test_composite_weights_and_gate() -> None:
    components = [
        {"function": "accuracy", "weight": 0.9, "gate": "format"},
        {"function": "format", "weight": 0.1},
        {"function": "length_penalty", "weight": 1.0, "name": "overlong", "kwargs": {"buffer_len": 10}},
    ]
    samples = [
        S("<think>t</think>\\boxed{7}", "7", response_length=5, max_response_length=100),
        S("\\boxed{7}", "7", response_length=5, max_response_length=100),  # right but unformatted: gated
        S("<think>t</think>\\boxed{8}", "7", response_length=95, max_response_length=100),
    ]
    with manager(components=components) as rm:
        out = rm.score(samples)
    assert out.scores == [pytest.approx(1.0), pytest.approx(0.0), pytest.approx(0.1 - 0.5)]
    assert out.components["accuracy"] == [1.0, 1.0, 0.0]  # raw values are still reported
    assert out.components["format"] == [1.0, 0.0, 1.0]
    assert out.components["overlong"] == [0.0, 0.0, -0.5]
    assert out.metrics["reward/accuracy/mean"] == pytest.approx(2 / 3)


def test_a_component_from_a_file_is_named_by_its_function(zoo: str) -> None:
    """``{function: my_reward.py:fn}``: the component's name, its gate key and its metrics' key are ``fn`` (as for
    ``package.module:fn``); the file name appears in descriptions only."""
    components = [{"function": f"{zoo}:vl", "weight": 1.0, "gate": "positional"}, {"function": f"{zoo}:positional"}]
    with manager(components=components) as rm:
        out = rm.score([S("7", "7"), S("8", "7")])
    assert sorted(out.components) == ["positional", "vl"]
    assert out.scores == [1.0 + 1.0, 0.0 + 0.0]  # vl scores len("7") = 1 when positional matched, gated to 0 else
    assert "reward/vl/mean" in out.metrics
    fn = make_reward_fn(f"{zoo}:vl")
    assert fn.name == "vl" and f"vl from {Path(zoo).name}:vl" in fn.describe()


def test_composite_gate_threshold_and_nested_components() -> None:
    components = [
        {"function": "similarity", "weight": 1.0, "gate": "g", "gate_threshold": 0.95, "kwargs": {"mode": "f1"}},
        {"function": "geo3k", "weight": 0.0, "name": "g"},
    ]
    with manager(components=components) as rm:
        out = rm.score([S("<think>t</think>\\boxed{3}", "3"), S("\\boxed{3}", "3")])
    assert out.scores == [1.0, 0.0]  # geo3k scored 0.9 on the second sample: below the 0.95 gate
    assert out.components["g/format"] == [1.0, 0.0]


def test_composite_config_errors() -> None:
    with pytest.raises(RewardConfigError, match="not a component"):
        manager(components=[{"function": "accuracy", "gate": "fmt"}])
    with pytest.raises(RewardConfigError, match="distinct 'name'"):
        manager(components=["format", "format"])
    with pytest.raises(RewardConfigError, match="did you mean 'weight'"):
        manager(components=[{"function": "format", "wieght": 1}])
    with pytest.raises(RewardConfigError, match="reward.components"):
        manager(kwargs={"mode": "f1"}, components=["similarity"])


# ------------------------------------------------------------------------------------------------ error isolation


def test_errors_are_isolated_counted_and_logged_once(zoo: str, caplog: pytest.LogCaptureFixture) -> None:
    bad = ["nan", "inf", "str", "none", "nodict", "raise"]
    samples = [S("ok")] + [S(r, ds=f"src{i}") for i, r in enumerate(bad)] + [S("fine")]
    with manager(zoo, "vl", fallback_score=-1.0) as rm, caplog.at_level(logging.WARNING, logger="vlmrl.scoring"):
        out = rm.score(samples)
        assert out.scores == [2.0] + [-1.0] * len(bad) + [4.0]
        assert out.errors == [
            None,
            "non_finite",
            "non_finite",
            "wrong_type",
            "wrong_type",
            "wrong_type",
            "exception",
            None,
        ]
        m = out.metrics
        assert (m["reward/errors"], m["reward/non_finite"], m["reward/wrong_type"], m["reward/exceptions"]) == (
            6,
            2,
            3,
            1,
        )
        text = caplog.text
        assert "sample 6 (data_source='src5'" in text and "ZeroDivisionError: boom" in text
        assert "sample 1 (data_source='src0'" in text and "score is nan" in text
        assert "component 'part' is inf" not in text  # only the first non_finite sample is detailed
        caplog.clear()
        rm.score([S("raise"), S("ok")])
        assert "ZeroDivisionError" not in caplog.text and "1 of 2 samples failed" in caplog.text


def test_on_error_raise_names_the_sample(zoo: str) -> None:
    with manager(zoo, "vl", on_error="raise") as rm:
        with pytest.raises(RewardError, match=r"exception on sample 1 \(data_source='bad'.*ZeroDivisionError"):
            rm.score([S("ok"), S("raise", ds="bad")])


def test_the_timeout_stops_every_kind_of_hang_with_the_default_settings(zoo: str) -> None:
    """reward.timeout_s holds with the defaults (one worker process): a Python loop, a loop that swallows
    exceptions, time.sleep and a socket read that never returns are all stopped, each costing only its sample."""
    assert RewardConfig().num_workers == 1 and RewardConfig().timeout_s == 30.0
    with manager(zoo, "vl", timeout_s=0.5) as rm:
        rm.score([S("warm")])  # the worker started
        t0 = time.perf_counter()
        out = rm.score([S("ab"), S("hang"), S("swallow"), S("sleep"), S("socket"), S("abc")])
        elapsed = time.perf_counter() - t0
        assert out.scores == [2.0, 0.0, 0.0, 0.0, 0.0, 3.0]
        assert out.errors == [None, "timeout", "timeout", "timeout", "timeout", None]
        assert out.metrics["reward/timeouts"] == 4.0
        assert elapsed < 10.0, elapsed
        again = rm.score([S("abcd")] * 50)  # the replaced workers score on
        assert again.scores == [4.0] * 50 and again.metrics["reward/errors"] == 0.0


@pytest.mark.parametrize("workers", [0, 1], ids=["in the driver", "in a worker"])
def test_exits_and_numbers_too_large_for_float32_are_counted_failures(zoo: str, workers: int) -> None:
    cases = [S("exit"), S("huge_int"), S("huge_float"), S("ok")] + ([S("die")] if workers else [])
    with manager(zoo, "vl", num_workers=workers, timeout_s=5.0 if workers else 0.0) as rm:
        out = rm.score(cases)
    assert out.errors[:4] == ["exception", "non_finite", "non_finite", None]
    assert out.scores[3] == 2.0
    if workers:
        assert out.errors[4] == "exception"


def test_scoring_in_the_driver_takes_no_timeout(zoo: str) -> None:
    with pytest.raises(RewardConfigError, match="reward.num_workers=0 scores in the driver's own thread"):
        manager(zoo, "vl", num_workers=0, timeout_s=30.0)
    with manager(zoo, "vl", num_workers=0, timeout_s=0) as rm:
        assert rm.score([S("abc")]).scores == [3.0]


# ------------------------------------------------------------------------------------------------------ worker pool


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` ended (a zombie counts as ended) within ``within_s``."""
    import psutil

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_pool_keeps_order_and_isolates_raise_nan_hang_and_death(zoo: str, tmp_path: Path) -> None:
    samples = [S("index", extra_info={"i": i}) for i in range(24)]
    samples[3] = S("raise")
    samples[9] = S("nan")
    samples[14] = S("sleep")  # blocked in C: only ending the worker stops it
    samples[20] = S("die")
    with manager(zoo, "vl", num_workers=2, timeout_s=1.0) as rm:
        rm.score([S("warm")])  # workers started
        t0 = time.perf_counter()
        out = rm.score(samples)
        elapsed = time.perf_counter() - t0
        expected = [float(i) for i in range(24)]
        for i in (3, 9, 14, 20):
            expected[i] = 0.0
        assert out.scores == expected
        assert [out.errors[i] for i in (3, 9, 14, 20)] == ["exception", "non_finite", "timeout", "exception"]
        assert elapsed < 8.0
        assert rm.score([S("index", extra_info={"i": i}) for i in range(10)]).scores == [float(i) for i in range(10)]
        # a reward with a process pool of its own (verl's math_verify): what a timed-out worker started ends with it,
        # what the others started ends with the manager (before: left waiting forever, parented to init)
        log = tmp_path / "pids"
        out = rm.score([S(r, extra_info={"pids": str(log)}) for r in ("subpool_hang", "subpool")])
        assert out.errors == ["timeout", None]
        started = dict(line.split() for line in log.read_text().splitlines())
        assert _gone(int(started["subpool_hang"])) and not _gone(int(started["subpool"]), 0.5)
    assert _gone(int(started["subpool"]))


def test_pool_sends_images_only_when_needed(zoo: str) -> None:
    img = Image.new("RGB", (8, 8))
    samples = [S("x", images=[img, img])] * 3
    with manager(zoo, "n_images", num_workers=1) as rm:
        assert rm.score(samples).scores == [2.0] * 3
    with manager(zoo, "n_images_blind", num_workers=1) as rm:
        assert rm.score(samples).scores == [0.0] * 3


# --------------------------------------------------------------------------------------------- config and example


def test_verl_overrides_through_hydra_config(zoo: str) -> None:
    from vlmrl.config import load

    cfg = load(
        [
            "data.train_files=train.parquet",
            "actor_rollout_ref.model.path=model",
            f"custom_reward_function.path={zoo}",
            "custom_reward_function.name=compute_score",
            "+custom_reward_function.reward_kwargs.bonus=0.25",
            "reward.timeout_s=5",
        ],
        config_name="grpo",
    )
    with RewardManager(cfg.reward, cfg.custom_reward_function) as rm:
        assert rm.score([S("7", "7"), S("8", "7")]).scores == [1.25, 0.25]


def test_example_custom_reward_looks_at_the_image() -> None:
    img = Image.new("RGB", (64, 64), "white")
    ImageDraw.Draw(img).ellipse((8, 8, 40, 40), fill=(220, 30, 30))
    objects = [{"colour": "red", "shape": "circle", "box": [16, 16, 80, 80]}]
    kw = {"images": [img], "image_scales": [(0.5, 0.5)], "extra_info": {"objects": objects}}
    path = str(REPO / "examples/custom_reward/my_reward.py")
    with manager(path, "compute_score") as rm:
        out = rm.score([S("It is red.", "red", **kw), S("blue", "red", **kw), S("blue", "blue", **kw)])
    assert out.scores == [pytest.approx(1.0), 0.0, pytest.approx(0.8)]
    assert out.components["seen"] == [1.0, 0.0, 0.0]


def test_quick_start_reward_sends_its_workers_no_images() -> None:
    """The quick start's reward reads only the text: its worker processes are sent the samples without their
    images (pickling 128 images a step to them was the step's reward cost; the time is a benchmark's, not a test's)."""
    choices = {"choices": ["red", "green", "blue", "yellow"]}
    img = Image.new("RGB", (64, 64), "red")
    samples = [S("<answer>It is red.</answer>", "red", "synthetic/colour", images=[img], extra_info=choices)] * 128
    with manager(function="synthetic") as rm:
        assert rm.needs_images is False and rm._pool is not None
        sent: list = []
        run = rm._pool.run
        rm._pool.run = lambda payload, **kw: sent.extend(payload) or run(payload, **kw)  # type: ignore[method-assign]
        out = rm.score(samples)
    assert out.scores == [1.0] * 128
    assert len(sent) == 128 and all(not s.images for s in sent)


def test_make_reward_fn_accepts_a_callable() -> None:
    fn = make_reward_fn(lambda sample, scale=1.0: scale * len(sample.response), {"scale": 2.0})
    assert fn.style == "vlmrl" and fn(S("abc")) == 6.0


def test_library_file_loads_by_path() -> None:
    path = str(REPO / "rewards/synthetic.py")
    with manager(path, "synthetic_reward") as rm:
        out = rm.score([S("blue", "blue", "synthetic/colour", extra_info={"choices": ["red", "blue"]})])
    assert out.scores == [1.0]
    with manager(function=f"{REPO / 'rewards/recipes.py'}:geo3k") as rm:
        assert rm.score([S("<think>t</think>\\boxed{2}", "2")]).scores == [1.0]
