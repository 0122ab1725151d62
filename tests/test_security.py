"""Security: code runs only when the person launching the run names it (reward files, estimators, templates in the
config). Nothing inside a dataset — a data_source, an extra_info field, a prompt, an image path — can make vlmrl import
or execute code, and Jinja chat templates render in a sandbox."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vlmrl.batch import RewardSample
from vlmrl.config import CustomRewardFunctionConfig, DataConfig, RewardConfig
from vlmrl.data.dataset import RLDataset
from vlmrl.data.records import DataError
from vlmrl.scoring import RewardManager
from vlmrl.scoring.loading import RewardConfigError

EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    pathlib.Path({marker!r}).write_text("called")
    return 1.0
"""


@pytest.fixture
def evil(tmp_path: Path) -> tuple[Path, Path]:
    """A Python file that leaves a marker file behind if it is ever imported or called."""
    marker = tmp_path / "pwned"
    path = tmp_path / "evil_reward.py"
    path.write_text(EVIL.format(marker=str(marker)))
    return path, marker


@pytest.mark.parametrize("source", ["{path}:compute_score", "{path}", "os:system", "subprocess:getoutput"])
def test_data_source_never_names_code(evil: tuple[Path, Path], source: str) -> None:
    """A record whose data_source looks like a function spec is routed like any other name: with no reward configured
    for it the run stops with a configuration error, and nothing is imported or called."""
    path, marker = evil
    ds = source.format(path=path)
    modules_before = set(sys.modules)
    with RewardManager(RewardConfig(), CustomRewardFunctionConfig()) as rm:
        with pytest.raises(RewardConfigError, match="no reward function for data_source"):
            rm.score([RewardSample(response="x", prompt="p", ground_truth="x", data_source=ds)])
    assert not marker.exists()
    assert not any("evil" in m for m in set(sys.modules) - modules_before)


def test_extra_info_and_ground_truth_are_data_not_code(evil: tuple[Path, Path]) -> None:
    """The built-in rewards read strings out of extra_info / ground_truth; a code-like value is just a wrong answer."""
    path, marker = evil
    payload = f"__import__('runpy').run_path('{path}')"
    with RewardManager(RewardConfig(), CustomRewardFunctionConfig()) as rm:
        out = rm.score(
            [
                RewardSample(response=payload, prompt="p", ground_truth=payload, data_source="hiyouga/geometry3k"),
                RewardSample(
                    response="red",
                    prompt="p",
                    ground_truth="red",
                    data_source="synthetic/colour",
                    extra_info={"choices": ["red", payload], "reward_fn": f"{path}:compute_score"},
                ),
            ]
        )
    assert out.scores[1] == 1.0
    assert not marker.exists()


def test_reward_file_named_by_the_launcher_is_the_one_way_in(evil: tuple[Path, Path]) -> None:
    """The contrast: the same file named in the config (custom_reward_function.path) is trusted and runs."""
    path, marker = evil
    cfg = CustomRewardFunctionConfig(path=str(path), name="compute_score")  # type: ignore[call-arg]
    with RewardManager(RewardConfig(), cfg) as rm:
        assert rm.score([RewardSample(response="x", prompt="p", ground_truth="x", data_source="any")]).scores == [1.0]
    assert marker.read_text() == "called"


def _parquet(path: Path, prompt: str, images: list[dict], data_source: str = "d") -> str:
    rows = [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": prompt}],
            "images": images,
            "ability": "x",
            "reward_model": {"style": "rule", "ground_truth": "a"},
            "extra_info": {"index": 0},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_dataset_text_is_never_rendered_as_a_template(tmp_path: Path, tiny_processor) -> None:
    """Jinja syntax inside a prompt is text: it reaches the model verbatim and is not evaluated."""
    prompt = "{{ ''.__class__.__mro__[1].__subclasses__() }} {% for x in range(3) %}loop{% endfor %} What?"
    path = _parquet(tmp_path / "t.parquet", prompt, [])
    ds = RLDataset(path, tiny_processor, DataConfig(max_prompt_length=4096), verbose=False)
    text = ds[0].prompt_text
    assert "{{ ''.__class__.__mro__[1].__subclasses__() }}" in text and "looploop" not in text


def test_custom_template_cannot_reach_python_internals(tmp_path: Path, tiny_processor) -> None:
    """A chat template (a config value) renders in Jinja's immutable sandbox: attribute tricks raise SecurityError
    and a template cannot mutate the messages it is given."""
    path = _parquet(tmp_path / "t.parquet", "Q", [])
    for template in (
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append({'role': 'user', 'content': 'x'}) }}",
        "{{ cycler.__init__.__globals__.os.system('touch " + str(tmp_path / "pwned") + "') }}",
    ):
        with pytest.raises(DataError, match="chat template failed: SecurityError|chat template failed: UndefinedError"):
            RLDataset(
                path, tiny_processor, DataConfig(max_prompt_length=4096, custom_chat_template=template), verbose=False
            )
    assert not (tmp_path / "pwned").exists()


def test_image_path_is_only_ever_opened_as_an_image(tmp_path: Path, tiny_processor) -> None:
    """An image entry pointing at a Python file (or any non-image) is read as bytes and rejected; never imported."""
    marker = tmp_path / "pwned"
    script = tmp_path / "payload.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    path = _parquet(tmp_path / "t.parquet", "<image>Q", [{"bytes": None, "path": str(script)}])
    with pytest.raises(DataError, match=r"row 0: image 0: image cannot be read"):
        RLDataset(path, tiny_processor, DataConfig(max_prompt_length=4096), verbose=False)
    assert not marker.exists()
    assert os.path.exists(script)
