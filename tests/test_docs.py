"""The documentation site (issue 43): it builds with warnings as errors, its generated pages hold what they are
generated from, and the README stays short with a status table whose tests exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vlmrl.config.reference import reference_markdown, schema_keys
from vlmrl.config.verl import RULES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mkdocs build --strict`` of the checkout (a broken link, a missing page or reference fails it)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _text(html: Path) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.read_text()))


def test_the_site_builds_strictly_with_every_page_of_the_nav(site: Path) -> None:
    nav = re.findall(r":\s+([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages  # every page is in the navigation, and the navigation names no missing page
    for page in nav:
        built = site / (page[: -len(".md")] + "/index.html" if page != "index.md" else "index.html")
        assert built.is_file(), page


def test_the_configuration_reference_lists_every_key_and_verl_rule(site: Path) -> None:
    text = _text(site / "reference" / "configuration" / "index.html")
    for key in schema_keys():
        assert key.path in text, key.path
    for rule in RULES:
        assert rule.pattern in text, rule.pattern


def test_the_api_reference_renders_the_extension_points_docstrings(site: Path) -> None:
    from vlmrl.algorithms.algorithm import RLAlgorithm
    from vlmrl.tools.base import BaseTool

    text = _text(site / "reference" / "api" / "index.html")
    for obj in (RLAlgorithm, BaseTool):
        first = " ".join((obj.__doc__ or "").split(".")[0].split()[:6])
        assert first and first.replace("``", "") in text.replace("  ", " "), (obj.__name__, first)
    for name in ("register_adv_est", "register_policy_loss", "RewardSample", "Needs", "ToolResponse"):
        assert name in text, name


def test_a_page_that_quotes_a_benchmark_shows_where_and_when_it_was_measured(site: Path) -> None:
    text = _text(site / "quickstart" / "index.html")
    footer = text[text.index("Where this page's figures come from") :]
    assert re.search(
        r"quickstart\.json\s*: measured \d{4}-\d\d-\d\d .* on .*, \d+ CPU cores, .*commit [0-9a-f]{8}", footer
    )


def test_every_schema_key_has_a_meaning() -> None:
    """The reference takes each key's meaning from its docstring in the schema: a key without one fails here."""
    missing = [k.path for k in schema_keys() if not k.doc.strip()]
    assert not missing, f"schema fields without a docstring: {missing}"
    assert "| `data.image_key` | `str` | `'images'` |" in reference_markdown()


def test_the_readme_is_short_and_its_status_table_names_tests_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    table = readme[readme.index("[start:status]") : readme.index("[end:status]")]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| feature")]
    assert len(rows) >= 10
    for row in rows:
        for name in re.findall(r"`(test_\w+)`", row):
            assert (ROOT / "tests" / f"{name}.py").is_file(), (name, row)
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
