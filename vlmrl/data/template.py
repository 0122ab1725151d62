"""Rendering a chat into prompt text: the processor's chat template, or ``data.custom_chat_template`` rendered in a
sandboxed Jinja environment (a template from a config file must not reach Python internals)."""

from __future__ import annotations

import json
from typing import Any


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def compile_template(source: str) -> Any:
    """Compile a Jinja chat template in ``ImmutableSandboxedEnvironment`` (the globals transformers gives its templates:
    ``raise_exception``, ``tojson``)."""
    return _environment().from_string(source)


def takes_tools(source: str | None) -> bool:
    """Whether a chat template renders a ``tools`` variable (verl's multi-turn templates and Qwen2.5's text template
    do; Qwen2.5-VL's own does not)."""
    if not source:
        return False
    from jinja2 import meta

    return "tools" in meta.find_undeclared_variables(_environment().parse(source))


class ChatRenderer:
    """Render chats to prompt text with the generation prompt added.

    ``custom_template`` (Jinja source) replaces the processor's template; it is rendered sandboxed with the variables
    transformers passes (``messages``, ``add_generation_prompt``, ``tools``, the tokenizer's special tokens).
    ``takes_tools``: the template renders the tools' schemas itself (else the caller writes them into the system
    message, as Qwen2.5's template would)."""

    def __init__(self, processor: Any, custom_template: str | None = None) -> None:
        self.processor = processor
        self.custom = compile_template(custom_template) if custom_template else None
        tok = getattr(processor, "tokenizer", processor)
        special = getattr(tok, "special_tokens_map", None) or {}
        self._special = {k: v for k, v in special.items() if isinstance(v, str)}
        own = getattr(processor, "chat_template", None) or getattr(tok, "chat_template", None)
        if self.custom is None and not own:
            raise ValueError("the processor has no chat template; set data.custom_chat_template")
        self.takes_tools = takes_tools(custom_template if custom_template else own if isinstance(own, str) else None)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text of ``messages`` (one image pad per image part), generation prompt added; ``tools`` (OpenAI
        schemas) reach a template that ``takes_tools``."""
        extra = {"tools": tools} if tools and self.takes_tools else {}
        if self.custom is not None:
            return self.custom.render(messages=messages, add_generation_prompt=True, **extra, **self._special)
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
