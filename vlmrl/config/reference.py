"""The configuration reference, generated: every key of the schema (type, default, meaning, whether verl spells it
the same) and every verl key vlmrl answers otherwise (the rule table of ``vlmrl.config.verl``), as Markdown.

The documentation site's configuration reference page is this output (``docs/hooks.py`` inserts it when the site is
built), so the page cannot drift from the schema. ``python -m vlmrl.config.reference`` prints it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from typing import Any

from vlmrl.config.schema import CHOICES, VLMRLConfig
from vlmrl.config.verl import ACCEPT, ALIAS, DROP, FEATURE, NOTICE, RULES, VALUE_REASONS, render, verl_keys


@dataclass(frozen=True)
class Key:
    """One key of the schema."""

    path: str
    type: str
    default: Any
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal under each field), by field name."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:] + [None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return MISSING


def schema_keys(cls: type = VLMRLConfig, prefix: str = "") -> Iterator[Key]:
    """Every leaf key of the schema under ``cls``, in declaration order (a field holding a dataclass is a group)."""
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        value = _default(f)
        if dataclasses.is_dataclass(value):
            yield from schema_keys(type(value), path + ".")
            continue
        yield Key(path, str(f.type), value, docs.get(f.name, ""))


def _cell(text: str) -> str:
    """Text for a Markdown table cell (one line, pipes escaped)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _show_default(value: Any) -> str:
    if value is MISSING or value == "???":
        return "required"
    return f"`{render(value)}`" if value not in ("", None) else ("`null`" if value is None else "`''`")


def schema_markdown() -> str:
    """The schema's keys as one table per top-level group."""
    verl = verl_keys()
    groups: dict[str, list[Key]] = {}
    for key in schema_keys():
        groups.setdefault(key.path.split(".")[0], []).append(key)
    out = []
    for group, keys in groups.items():
        out += [f"### `{group}`", "", "| key | type | default | meaning | verl |", "|---|---|---|---|---|"]
        for k in keys:
            meaning = k.doc
            if k.path in CHOICES:
                meaning += " Values: " + ", ".join(f"`{c}`" for c in CHOICES[k.path]) + "."
            out.append(
                f"| `{k.path}` | `{_cell(k.type)}` | {_cell(_show_default(k.default))} | {_cell(meaning)} | "
                f"{'same key' if k.path in verl else '—'} |"
            )
        out.append("")
    return "\n".join(out)


_KINDS = (
    (ALIAS, "Aliases: the same setting under verl's path", "vlmrl's key (value map)"),
    (NOTICE, "Accepted with a notice: switches vlmrl has no use for", "what vlmrl does instead"),
    (ACCEPT, "Accepted at the value that means off; other values refused", "accepted values: the feature refused"),
    (FEATURE, "Refused, naming the feature vlmrl does not implement", "the feature"),
)


def rules_markdown() -> str:
    """verl's keys that are not vlmrl's own, by how they are answered (first matching pattern wins)."""
    out = []
    for kind, title, column in _KINDS:
        out += [f"### {title}", "", f"| verl key (pattern) | {column} |", "|---|---|"]
        for rule in (r for r in RULES if r.kind == kind):
            if kind == ALIAS:
                target = f"`{rule.target}`"
                if rule.mapping:
                    pairs = ", ".join(
                        f"`{render(a)}` → {'no effect' if b is DROP else f'`{render(b)}`'}"
                        for a, b in rule.mapping.items()
                    )
                    target += f" ({pairs})"
                if rule.why:
                    target += f": {rule.why}"
                what = target
            elif kind == ACCEPT:
                what = ", ".join(f"`{render(v)}`" for v in rule.values) + f": {rule.why}"
            else:
                what = rule.why
            out.append(f"| `{_cell(rule.pattern)}` | {_cell(what)} |")
        out.append("")
    out += [
        "### Values of vlmrl's keys that name a verl feature",
        "",
        "| key = value | why it is refused |",
        "|---|---|",
    ]
    for (key, value), why in VALUE_REASONS.items():
        out.append(f"| `{key}={render(value)}` | {_cell(why)} |")
    out += [
        "",
        "A key of verl's config that no rule above covers and vlmrl does not have is refused as a verl setting vlmrl "
        "does not implement; a key that is neither vlmrl's nor verl's gets the nearest vlmrl key as a suggestion.",
        "",
    ]
    return "\n".join(out)


def reference_markdown() -> str:
    """The whole reference: the schema, then verl's keys."""
    return "\n".join(
        [
            "## vlmrl's keys",
            "",
            "Every key vlmrl implements, from `vlmrl/config/schema.py` (its docstrings are the meanings). Set them as "
            "Hydra overrides (`data.image_key=images`) or in a config file. *verl* says whether verl 0.9.1's trainer "
            "config has the same key.",
            "",
            schema_markdown(),
            "## verl's other keys",
            "",
            "How each key of verl 0.9.1's config that vlmrl does not implement under that name is answered "
            "(`vlmrl/config/verl/rules.py`).",
            "",
            rules_markdown(),
        ]
    )


if __name__ == "__main__":
    print(reference_markdown())
