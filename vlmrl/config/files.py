"""Config files named on the command line (``--config-path`` / ``--config-dir`` / ``--config-name``) are settings.

vlmrl composes its config with Hydra's compose API, which runs nothing: no callbacks, launchers, sweepers or job
settings. Hydra's own config (its ``hydra`` node and ``hydra/`` groups) therefore has no effect in vlmrl, and a
setting that would have none is refused, never dropped silently: a YAML file of a config folder other than vlmrl's
own ``configs/`` that sets it is named (:func:`hydra_config_problems`), as is a key of a verl config file read as
overrides (``vlmrl.config.verl.files``) and a ``hydra.*`` override on the command line (``vlmrl.config.translate``).
"""

from __future__ import annotations

import os
import re
from typing import Any

from vlmrl import configs_dir

NO_EFFECT = (
    "Hydra's own config has no effect in vlmrl (it composes its config with Hydra's compose API, which runs no "
    "callbacks, launchers or job settings): remove it"
)
"""Why a ``hydra`` setting is refused."""

MAX_CONFIG_FILES = 1000
"""The most files a ``--config-path`` / ``--config-dir`` folder may hold for its YAML files to be checked."""
MAX_CONFIG_BYTES = 5_000_000
"""The largest YAML file of such a folder that is checked; a larger one is refused."""


def names_hydra(key: Any) -> bool:
    """True when a key or a defaults entry, as a config file or an override writes it (``hydra.callbacks``,
    ``+hydra``, ``~hydra.run``, ``override hydra/job_logging``, ``/hydra/launcher``, ``db@hydra.job``), reaches
    Hydra's own config (its ``hydra`` node or one of its ``hydra/`` groups)."""
    text = str(key).strip()
    for word in ("override ", "optional "):
        text = text.removeprefix(word).strip()
    text = text.lstrip("+~/ ")
    group, _, package = text.partition("@")
    first = re.split(r"[./:\s]", group, maxsplit=1)[0]
    return first == "hydra" or package.strip().removeprefix("_global_.").split(".")[0] == "hydra"


def defaults_entries(defaults: Any) -> list[str]:
    """The names a defaults list holds: its strings and the keys of its mappings."""
    if not isinstance(defaults, list):
        return []
    return [str(d) for d in defaults if not isinstance(d, dict)] + [
        str(k) for d in defaults if isinstance(d, dict) for k in d
    ]


def _hydra_parts(file: str) -> list[str]:
    """What of a YAML file would reach Hydra's own config, each as the text to name it by: a top-level key
    (``'hydra'``, ``'+hydra.callbacks'``), a ``# @package hydra...`` header, a defaults entry naming a ``hydra/``
    group or package. A file that is not YAML gives none (Hydra cannot compose it either)."""
    import yaml

    try:
        if os.path.getsize(file) > MAX_CONFIG_BYTES:
            return [f"a file of over {MAX_CONFIG_BYTES // 1_000_000} MB (too large to check)"]
        with open(file, encoding="utf-8") as f:
            text = f.read()
        doc = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    doc = doc if isinstance(doc, dict) else {}
    parts = [f"'{k}'" for k in doc if k != "defaults" and names_hydra(k)]
    header = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
    if header and names_hydra("@" + header.group(1)):
        parts.append(f"'# @package {header.group(1)}'")
    parts += [f"its defaults entry '{e}'" for e in defaults_entries(doc.get("defaults")) if names_hydra(e)]
    return parts


def hydra_config_problems(folders: list[str]) -> list[str]:
    """YAML files of the ``--config-path`` / ``--config-dir`` folders (other than vlmrl's configs) that set Hydra's
    own config (``_hydra_parts``), each named with the part; a folder too large to check is refused too."""

    ours = os.path.realpath(configs_dir())
    problems: list[str] = []
    seen = 0
    for folder in dict.fromkeys(os.path.realpath(f) for f in folders if os.path.isdir(f)):
        if folder == ours:
            continue
        for root, dirs, files in os.walk(folder, followlinks=True):  # Hydra follows links too
            dirs.sort()
            seen += len(files) + len(dirs)
            if seen > MAX_CONFIG_FILES:
                return problems + [
                    f"{folder}: more than {MAX_CONFIG_FILES} files to check for Hydra settings; "
                    "point --config-path / --config-dir at a folder of config files."
                ]
            for name in sorted(files):
                if name.endswith((".yaml", ".yml")):
                    file = os.path.join(root, name)
                    problems += [
                        f"{file}: {part} would set Hydra's own config; {NO_EFFECT}." for part in _hydra_parts(file)
                    ]
    return problems
