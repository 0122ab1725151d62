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


def compile_template(source: str) -> Any:
    """Compile a Jinja chat template in ``ImmutableSandboxedEnvironment`` (the globals transformers gives its templates:
    ``raise_exception``, ``tojson``)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source)


class ChatRenderer:
    """Render chats to prompt text with the generation prompt added.

    ``custom_template`` (Jinja source) replaces the processor's template; it is rendered sandboxed with the variables
    transformers passes (``messages``, ``add_generation_prompt``, the tokenizer's special tokens)."""

    def __init__(self, processor: Any, custom_template: str | None = None) -> None:
        self.processor = processor
        self.custom = compile_template(custom_template) if custom_template else None
        tok = getattr(processor, "tokenizer", processor)
        special = getattr(tok, "special_tokens_map", None) or {}
        self._special = {k: v for k, v in special.items() if isinstance(v, str)}
        if self.custom is None and not (
            getattr(processor, "chat_template", None) or getattr(tok, "chat_template", None)
        ):
            raise ValueError("the processor has no chat template; set data.custom_chat_template")

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text of ``messages`` (one image pad per image part), generation prompt added."""
        if self.custom is not None:
            return self.custom.render(messages=messages, add_generation_prompt=True, **self._special)
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
