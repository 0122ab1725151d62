"""Regenerate vlmrl/config/verl/keys.txt: every key path of verl's trainer config (the installed verl's
generated reference YAMLs, FSDP and Megatron), one per line. vlmrl reads it to tell a real verl key it does not
implement (named with its feature) from a misspelling (named with the nearest vlmrl key).

    .venv/bin/python scripts/verl_keys.py            # rewrite the file
    .venv/bin/python scripts/verl_keys.py --check    # exit 1 when the file differs from the installed verl's keys
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "vlmrl" / "config" / "verl" / "keys.txt"
SOURCES = ("_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml")


def leaves(node: object, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves of a YAML mapping (lists and empty mappings are leaves; Hydra's ``_target_`` entries
    are not keys)."""
    if not isinstance(node, dict) or not node:
        return [prefix]
    out: list[str] = []
    for k, v in node.items():
        if k == "_target_":
            continue
        out += leaves(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def verl_keys() -> tuple[str, list[str]]:
    """(verl's version, its sorted key paths), read from the installed package's files (verl itself is not imported)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("verl is not installed (bash scripts/install.sh installs it --no-deps)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    keys: set[str] = set()
    for name in SOURCES:
        keys.update(leaves(yaml.safe_load((folder / name).read_text())))
    return importlib.metadata.version("verl"), sorted(keys)


def render() -> str:
    version, keys = verl_keys()
    head = f"# verl {version}: key paths of {', '.join(SOURCES)} (scripts/verl_keys.py writes this file)\n"
    return head + "\n".join(keys) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    text = render()
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("up to date" if same else f"{OUT} differs from the installed verl's keys: run scripts/verl_keys.py")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({text.count(chr(10)) - 1} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
