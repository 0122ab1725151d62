"""A checkpoint is data: resuming from it or exporting it runs nothing stored in it.

Each test plants a payload that would create a marker file when unpickled: in DCP's ``.metadata``, in a byte item
of the sharded state (the optimizer's learning rate), in the per-rank extra state. Stock PyTorch loading runs the
payload (shown, so the payload is real); vlmrl's loading refuses the file and the marker never appears. Export takes
``trust_remote_code`` from its command line only, never from the checkpoint's config.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from utils import inline_cfg, synthetic_data

from vlmrl.safe_load import UnsafeCheckpointError, safe_dcp_load


class Payload:
    """Unpickling this creates ``marker`` (a stand-in for any code an attacker would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def run(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-step run (one in-process worker) with a checkpoint at step 2."""
    from vlmrl.trainer.grpo import fit

    tmp = tmp_path_factory.mktemp("ckpt")
    synthetic_data(tmp / "data")
    fit(inline_cfg(tiny_model_dir, tmp / "data", tmp / "run", "trainer.total_training_steps=2", "trainer.save_freq=2"))
    assert (tmp / "run" / "global_step_2" / "actor" / "extra_rank0.json").is_file()
    return tmp / "run"


def copy_of(run: Path, tmp: Path) -> Path:
    dst = tmp / "copy"
    shutil.copytree(run / "global_step_2", dst / "global_step_2")
    return dst / "global_step_2"


def resume(run_dir: Path, ckpt: Path, model: str, data: Path) -> Exception:
    from vlmrl.trainer.grpo import Trainer

    cfg = inline_cfg(
        model,
        data,
        run_dir,
        "trainer.total_training_steps=3",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={ckpt}",
    )
    with pytest.raises(Exception) as e:
        Trainer(cfg).close()
    return e.value


def test_planted_metadata_pickle_does_not_run(run: Path, tmp_path: Path, tiny_model_dir: str) -> None:
    ckpt = copy_of(run, tmp_path)
    marker = tmp_path / "pwned-metadata"
    (ckpt / "actor" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: the checkpoint's metadata refers to pathlib"):
        safe_dcp_load({"model": {}}, str(ckpt / "actor"))
    err = resume(tmp_path / "resumed", ckpt, tiny_model_dir, run.parent / "data")
    assert "refusing to load it" in str(err)
    from vlmrl.export import main as export

    assert export(["--checkpoint", str(ckpt.parent), "--output", str(tmp_path / "exported")]) == 2
    assert not marker.exists()
    with open(ckpt / "actor" / ".metadata", "rb") as f:  # the same file through plain pickle: the payload is live
        pickle.load(f)
    assert marker.exists()


def test_planted_byte_item_does_not_run(run: Path, tmp_path: Path) -> None:
    """A checkpoint whose optimizer learning rate is a payload: DCP's stock loader unpickles it with
    weights_only=False; vlmrl's loads byte items with weights_only=True and refuses."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "pwned-bytes"
    state = {"optim": {"param_groups.0.lr": Payload(marker)}, "model": {"w": torch.zeros(2)}}
    dcp.save(state, checkpoint_id=str(tmp_path / "evil"), no_dist=True)
    target = {"optim": {"param_groups.0.lr": 0.0}, "model": {"w": torch.ones(2)}}
    with pytest.raises(UnsafeCheckpointError, match="param_groups.0.lr' is not plain data"):
        safe_dcp_load(target, str(tmp_path / "evil"), allow_partial_load=True)
    assert not marker.exists()
    dcp.load(
        {"optim": {"param_groups.0.lr": 0.0}, "model": {"w": torch.ones(2)}},
        checkpoint_id=str(tmp_path / "evil"),
        no_dist=True,
    )
    assert marker.exists(), "stock DCP loading runs the payload: the test's payload is real"


def test_the_extra_state_is_json_and_an_old_pickle_is_refused(run: Path, tmp_path: Path, tiny_model_dir: str) -> None:
    ckpt = copy_of(run, tmp_path)
    data = run.parent / "data"
    marker = tmp_path / "pwned-extra"
    extra = ckpt / "actor" / "extra_rank0.json"
    extra.unlink()
    torch.save({"scheduler": Payload(marker)}, ckpt / "actor" / "extra_rank0.pt")
    err = resume(tmp_path / "r1", ckpt, tiny_model_dir, data)
    assert "is a pickle (written by an older vlmrl): not loaded" in str(err)
    extra.write_text('{"scheduler": "__import__(\'os\')", "rng": {}}')
    err = resume(tmp_path / "r2", ckpt, tiny_model_dir, data)
    assert "extra_rank0.json: not a vlmrl worker state" in str(err)
    assert not marker.exists()


def test_a_good_checkpoint_still_resumes_exactly(run: Path, tmp_path: Path, tiny_model_dir: str) -> None:
    """The safe loading changes nothing for a good checkpoint: resumed from a copy of the step-2 checkpoint, step 3
    gives what an uninterrupted 3-step run gives at step 3: the same sampled responses, the same metrics and the
    same final weights, bit for bit (and step 3 did train them: they are not the checkpoint's)."""
    import json

    from transformers import AutoModelForImageTextToText

    from vlmrl.export import export_checkpoint
    from vlmrl.trainer.grpo import Trainer
    from vlmrl.trainer.tracking import read_metrics

    ckpt = copy_of(run, tmp_path)
    data = run.parent / "data"

    def finish(out: Path, *extra: str) -> tuple[int, list[dict], list[dict], dict[str, torch.Tensor]]:
        cfg = inline_cfg(
            tiny_model_dir,
            data,
            out,
            "trainer.total_training_steps=3",
            f"trainer.rollout_data_dir={out / 'samples'}",
            *extra,
        )
        t = Trainer(cfg)
        try:
            start = t.step
            t.fit()
            weights = {k: v.detach().cpu().clone() for k, v in t.group.worker.policy.engine_weights()}
        finally:
            t.close()
        samples = [json.loads(x) for x in (out / "samples" / "step_000003.jsonl").read_text().splitlines()]
        return start, read_metrics(out / "metrics.jsonl"), samples, weights

    s_ref, ref_rows, ref_samples, ref_w = finish(tmp_path / "uninterrupted", "trainer.save_freq=2")
    s_res, res_rows, res_samples, res_w = finish(
        tmp_path / "resumed", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}"
    )
    assert (s_ref, s_res) == (0, 2)
    assert [r["step"] for r in ref_rows] == [1, 2, 3] and [r["step"] for r in res_rows] == [3]
    first = read_metrics(run / "metrics.jsonl")  # the run the checkpoint came from: the same steps 1-2
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "response_length/mean"):
        assert [r[key] for r in first] == [r[key] for r in ref_rows[:2]], key
        assert res_rows[0][key] == ref_rows[2][key], (key, res_rows[0][key], ref_rows[2][key])
    assert [(r["prompt"], r["response"], r["score"]) for r in res_samples] == [
        (r["prompt"], r["response"], r["score"]) for r in ref_samples
    ]
    assert res_w.keys() == ref_w.keys()
    assert [k for k in ref_w if not torch.equal(res_w[k], ref_w[k])] == []
    export_checkpoint(ckpt, tmp_path / "step2")
    step2 = AutoModelForImageTextToText.from_pretrained(tmp_path / "step2", dtype=torch.float32).state_dict()
    assert sum(not torch.equal(res_w[k], step2[k]) for k in res_w) > len(res_w) // 2  # step 3 trained


def test_export_takes_trust_remote_code_from_its_command_line_only(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vlmrl.export as policy  # the load_model export calls
    from vlmrl.export import main as export

    ckpt = copy_of(run, tmp_path)
    cfg_file = ckpt / "config.yaml"
    cfg_file.write_text(cfg_file.read_text().replace("trust_remote_code: false", "trust_remote_code: true"))
    assert "trust_remote_code: true" in cfg_file.read_text()
    seen = []
    real = policy.load_model
    monkeypatch.setattr(
        policy,
        "load_model",
        lambda path, device, trust=False, where=None: (seen.append(trust), real(path, device, trust, where))[1],
    )
    assert export(["--checkpoint", str(ckpt), "--output", str(tmp_path / "a")]) == 0
    assert seen == [False], "the checkpoint's own config must not turn remote code on"
    assert (tmp_path / "a" / "config.json").is_file()
    assert os.path.getsize(tmp_path / "a" / "model.safetensors") > 1000


def test_export_refuses_an_interpolation_in_a_checkpoints_config(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint's config.yaml is data: ``${oc.env:...}`` in the model path is refused naming the key, and the
    environment variable's value is neither used nor printed (OmegaConf.load resolved it)."""
    from vlmrl.export import main as export

    ckpt = copy_of(run, tmp_path)
    cfg_file = ckpt / "config.yaml"
    text = cfg_file.read_text()
    monkeypatch.setenv("VLMRL_TEST_SECRET", "s3cr3t-value")
    for line in text.splitlines():
        if line.strip().startswith("path:"):
            cfg_file.write_text(text.replace(line, line.split("path:")[0] + "path: ${oc.env:VLMRL_TEST_SECRET}/m", 1))
            break
    assert "${oc.env:VLMRL_TEST_SECRET}" in cfg_file.read_text()
    assert export(["--checkpoint", str(ckpt), "--output", str(tmp_path / "out")]) == 2
    out = capsys.readouterr()
    assert "actor_rollout_ref.model.path holds an interpolation" in out.err, out.err
    assert "s3cr3t-value" not in out.out + out.err and not (tmp_path / "out").exists()


def test_a_folder_that_holds_a_model_is_not_overwritten_without_the_flag(
    run: Path, tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """export, the reward-model trainer and the judge trainer refuse an --output that holds a model (a base model's
    folder would lose its weights), naming it, before anything loads; --overwrite replaces it."""
    import shutil

    from vlmrl.export import main as export
    from vlmrl.reward_model.train import main as train_rm
    from vlmrl.reward_model.train_judge import main as train_judge

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    before = {p.name: p.stat().st_mtime_ns for p in base.iterdir()}
    assert export(["--checkpoint", str(run), "--output", str(base)]) == 2
    assert f"{base} already holds a model" in capsys.readouterr().err
    rm = ["--model", tiny_model_dir, "--data", str(tmp_path / "unread.parquet"), "--output", str(base)]
    assert train_rm(rm) == 2 and "--overwrite to replace it" in capsys.readouterr().err
    assert train_judge(rm) == 2 and f"{base} already holds a model" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in base.iterdir()} == before
    assert export(["--checkpoint", str(run), "--output", str(base), "--overwrite"]) == 0
    assert (base / "model.safetensors").stat().st_mtime_ns != before["model.safetensors"]


def test_export_names_an_output_that_is_a_file_and_a_base_model_it_cannot_load(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44 item 11: an --output that is a file is refused before anything loads; a --model hub id that cannot
    be fetched (offline) is one line and exit 2, not a traceback."""
    import huggingface_hub.constants

    from vlmrl.export import main as export

    (tmp_path / "a-file").write_text("x")
    assert export(["--checkpoint", str(run), "--output", str(tmp_path / "a-file")]) == 2
    assert "a-file is a file, not a folder" in capsys.readouterr().err
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert export(["--checkpoint", str(run), "--output", str(tmp_path / "o"), "--model", "someorg/somemodel"]) == 2
    err = capsys.readouterr().err
    assert "the base model could not be loaded" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{response:{question.__class__}}", "takes no format spec"),  # the data in question would become a spec
        ("Q: {question} A: {response:{ground_truth}}", "takes no format spec"),
        ("{response!r}", "takes no format spec or conversion"),
        ("{question.__class__.__init__} {response}", "names ['question.__class__.__init__']"),
        ("{ground_truth[0]} {response}", "names ['ground_truth[0]']"),
        ("{0} {response}", "names ['0']"),
        ("Q: {question} T: {ground_truth}", "has no {response}"),
    ],
)
def test_a_judge_template_is_checked_wherever_it_comes_from(
    template: str, why: str, tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 44 item 3: a judge template names its fields bare; nested format specs (data would become a spec),
    conversions, attribute or index access and a template without {response} are refused at the config gate and by
    ``train_judge --template`` (exit 2, before anything loads)."""
    from vlmrl.config.reward_model import template_problems
    from vlmrl.reward_model.train_judge import main as train_judge

    assert why in " ".join(template_problems(template))
    argv = ["--model", tiny_model_dir, "--data", str(tmp_path / "unread.parquet"), "--output", str(tmp_path / "j")]
    assert train_judge([*argv, "--template", template]) == 2
    assert why in capsys.readouterr().err and not (tmp_path / "j").exists()


def test_data_in_a_judge_prompt_stays_text() -> None:
    """A record whose question or answer carries format syntax is inserted as written; nothing of it is evaluated."""
    from vlmrl.config.reward_model import DEFAULT_JUDGE_TEMPLATE, render_template, template_problems

    hostile = "{response:{question.__class__}} {0} {ground_truth.__init__.__globals__}"
    text = render_template(DEFAULT_JUDGE_TEMPLATE, {"question": hostile, "response": hostile, "ground_truth": "x"})
    assert text.count(hostile) == 2 and template_problems(DEFAULT_JUDGE_TEMPLATE) == []
    with pytest.raises(ValueError, match="not one of"):
        render_template("{response:{question}}", {"question": "q", "response": "r", "ground_truth": "g"})


def test_metadata_written_by_python_3_11_early_patches_loads_and_getattr_reaches_nothing_else() -> None:
    """Python 3.11.0-3.11.4 pickle an enum member as ``getattr(EnumClass, name)`` (DCP's ``_MEM_FORMAT_ENCODING`` in
    every ``.metadata``): the metadata unpickler accepts exactly that, an allowed enum's member by name, and refuses
    getattr on anything else (a class's other attributes, a non-enum class)."""
    import io
    import pathlib
    import pickle

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from vlmrl.safe_load import MetadataUnpickler, UnsafeCheckpointError

    class Via:
        def __init__(self, target: object, name: str) -> None:
            self.target, self.name = target, name

        def __reduce__(self):
            return getattr, (self.target, self.name)

    def load(obj: object) -> object:
        return MetadataUnpickler(io.BytesIO(pickle.dumps(obj))).load()

    member = next(iter(_MEM_FORMAT_ENCODING))
    assert load(Via(_MEM_FORMAT_ENCODING, member.name)) is member
    for target, name in ((_MEM_FORMAT_ENCODING, "__class__"), (pathlib.Path, "home"), (_MEM_FORMAT_ENCODING, "nope")):
        with pytest.raises(UnsafeCheckpointError, match="not an enum member"):
            load(Via(target, name))
