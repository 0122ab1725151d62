"""Loading tools from a tool config file in verl's format (``multi_turn.tool_config_path``)::

    tools:
      - class_name: "verl.tools.geo3k_tool.Geo3kTool"   # or image_zoom | geo3k_check | calculator | file.py:Class
        config: {type: native}
        tool_schema: {type: function, function: {name: ..., description: ..., parameters: {...}}}

``class_name`` is a built-in's short name, one of verl's classes that vlmrl implements (its schema and config load
unchanged), ``path/to/file.py:Class`` or ``package.module.Class`` (code the person launching the run names, like a
reward file). A tool class needs ``execute`` (see ``vlmrl.tools.base``). MCP and sandbox tools are refused by name.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from vlmrl.tools.base import BaseTool
from vlmrl.tools.builtin import BUILTIN, VERL_CLASSES
from vlmrl.userfiles import is_file_target, load_callable, split_spec

_NOT_HERE = {
    "verl.tools.mcp_search_tool.MCPSearchTool": "MCP servers",
    "verl.tools.mcp_base_tool.MCPBaseTool": "MCP servers",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "the SandboxFusion code sandbox service",
    "verl.tools.search_tool.SearchTool": "the search-R1 retrieval service",
    "verl.tools.gsm8k_tool.Gsm8kTool": "verl's gsm8k checker (use geo3k_check or a tool file)",
}


class ToolConfigError(ValueError):
    """A tool config that cannot be loaded; the message names the file and the entry."""


def resolve_class(class_name: str, where: str) -> type:
    """The class a ``class_name`` names."""
    if class_name in BUILTIN:
        return BUILTIN[class_name]
    if class_name in VERL_CLASSES:
        return VERL_CLASSES[class_name]
    if class_name in _NOT_HERE:
        raise ToolConfigError(f"{where}: {class_name} needs {_NOT_HERE[class_name]}, which vlmrl does not run")
    target, name = split_spec(class_name)
    if name is not None and is_file_target(target):
        try:
            return load_callable(class_name, what=where)
        except (FileNotFoundError, ValueError, AttributeError) as e:
            raise ToolConfigError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - the file's own code failed (a syntax error, a missing import)
            raise ToolConfigError(f"{where}: cannot load {class_name!r}: {type(e).__name__}: {e}") from e
    module, _, attr = class_name.rpartition(".") if name is None else (target, "", name)
    if not module:
        known = ", ".join(sorted(BUILTIN))
        raise ToolConfigError(
            f"{where}: class_name {class_name!r} is not a built-in tool ({known}), a file.py:Class "
            "or a package.module.Class"
        )
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ToolConfigError(f"{where}: cannot import {class_name!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the module's own code failed
        raise ToolConfigError(f"{where}: cannot import {class_name!r}: {type(e).__name__}: {e}") from e
    return cls


def load_tool_config(path: str | Path) -> list[dict[str, Any]]:
    """The ``tools`` entries of a tool config file, checked (every entry a mapping with ``class_name``)."""
    import yaml

    p = Path(path).expanduser()
    if not p.is_file():
        raise ToolConfigError(f"multi_turn.tool_config_path: {path!r} is not a file")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ToolConfigError(f"{p}: not valid YAML: {e}") from None
    entries = (doc or {}).get("tools") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"{p}: expected a non-empty list under 'tools:'")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("class_name"), str):
            raise ToolConfigError(f"{p}: tools[{i}] needs a class_name")
        kind = (e.get("config") or {}).get("type", "native")
        if kind != "native":
            raise ToolConfigError(f"{p}: tools[{i}] has config.type={kind!r}; vlmrl runs native tools only")
    return entries


def build_tools(path: str | Path) -> dict[str, BaseTool]:
    """The tools of a config file by name (the name the policy calls them by)."""
    out: dict[str, BaseTool] = {}
    for i, e in enumerate(load_tool_config(path)):
        where = f"{path}: tools[{i}]"
        cls = resolve_class(e["class_name"], where)
        try:
            tool = cls(dict(e.get("config") or {}), e.get("tool_schema"))
        except Exception as err:  # noqa: BLE001 - any construction error becomes a config error naming the entry
            raise ToolConfigError(f"{where} ({e['class_name']}): {type(err).__name__}: {err}") from None
        if not callable(getattr(tool, "execute", None)) or not getattr(tool, "name", None):
            raise ToolConfigError(f"{where}: {e['class_name']} has no execute() or name")
        if tool.name in out:
            raise ToolConfigError(f"{where}: two tools are named {tool.name!r}")
        out[tool.name] = tool
    return out


def tool_schemas(tools: dict[str, BaseTool]) -> list[dict[str, Any]]:
    """The OpenAI schemas the policy is shown, in config order."""
    out = []
    for t in tools.values():
        s = t.get_openai_tool_schema()
        out.append(s.model_dump(exclude_unset=True, exclude_none=True) if hasattr(s, "model_dump") else dict(s))
    return out


def config_tool_schemas(cfg: Any) -> list[dict[str, Any]] | None:
    """The schemas of the run's tools when ``actor_rollout_ref.rollout.multi_turn.enable`` (else None): what the
    dataset writes into every prompt's system message."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return None
    return tool_schemas(build_tools(mt.tool_config_path))
