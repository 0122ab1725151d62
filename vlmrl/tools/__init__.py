"""Tools a multi-turn policy calls (``actor_rollout_ref.rollout.multi_turn``): the protocol (``base``), the hermes
call format (``hermes``), the built-ins (``builtin``) and verl's tool-config loader (``config``)."""

from vlmrl.tools.base import BaseTool, ToolResponse
from vlmrl.tools.config import build_tools, load_tool_config, tool_schemas

__all__ = ["BaseTool", "ToolResponse", "build_tools", "load_tool_config", "tool_schemas"]
