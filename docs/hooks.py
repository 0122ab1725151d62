"""MkDocs hooks: the configuration reference page is generated from the schema and verl's rule table when the site
is built (``vlmrl.config.reference``, where the page holds ``MARKER``), and every page that names a benchmark gets
a footer with the provenance of its results files (``benchmarks/provenance.py``: date, machine, commit, command,
and how many commits changed the measured code since)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- generated: vlmrl.config.reference -->"


def _provenance() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import provenance
    finally:
        sys.path.pop(0)
    return provenance


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Insert the generated configuration reference; add the provenance footer."""
    if MARKER in markdown:
        from vlmrl.config.reference import reference_markdown

        markdown = markdown.replace(MARKER, reference_markdown())
    if page.file.src_uri == "benchmarks.md":  # benchmarks/README.md itself: every file, described there
        return markdown
    prov = _provenance()
    named = []
    for path in sorted(prov.RESULTS.glob("*.json")):
        script = prov.script_of(prov.command_of(path.name))
        if f"results/{path.name}" in markdown or (script and script in markdown):
            named.append(prov.describe(prov.of(path.name)))
    if named:
        markdown += "\n\n---\n\n**Where this page's figures come from** (`python benchmarks/provenance.py`):\n\n"
        markdown += "\n".join(f"- {line}" for line in named) + "\n"
    return markdown
