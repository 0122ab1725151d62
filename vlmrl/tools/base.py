"""The tool protocol, close to verl's ``BaseTool``: one object per tool, one instance per call.

A tool is constructed once per tool worker process (``vlmrl.tools.runner``) with ``(config, tool_schema)`` (the
``config`` and ``tool_schema`` entries of verl's tool YAML). For every call the agent loop runs
``create(create_kwargs=...)`` (the record's ``extra_info.tools_kwargs[<tool name>].create_kwargs``, which is data:
it cannot replace what the agent gives, ``image``: the record's first image as the model sees it, ``source_image``:
the same image before resizing, ``image_bounds``: (patch factor, min_pixels, max_pixels); ``ground_truth``: the
record's), then ``execute(instance_id, arguments)``, then ``release(instance_id)``, all in one worker process, which
is ended when the call runs past ``tool_timeout_s``. Each method may be ``async`` (as verl's) or plain.

``execute`` returns ``(ToolResponse, step_reward, metrics)``: the text and/or images the policy reads next, a step
reward (verl's ``tool_rewards``), and a dict of numbers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from PIL import Image


@dataclass
class ToolResponse:
    """What a tool gives back to the policy (verl's ``ToolResponse``: ``text``, ``image``)."""

    text: str | None = None
    image: list[Image.Image] | None = None

    def __post_init__(self) -> None:
        if self.image is not None and not isinstance(self.image, list):
            raise TypeError(f"ToolResponse.image must be a list of images, got {type(self.image).__name__}")


@dataclass
class ToolSchema:
    """An OpenAI function schema (``{"type": "function", "function": {"name", "description", "parameters"}}``)."""

    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The function's name (what the policy writes in a call)."""
        return str(self.raw.get("function", {}).get("name", ""))

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """The schema as a dict (pydantic's spelling, which verl's tools call)."""
        return dict(self.raw)


class BaseTool:
    """A tool. Subclass it and override ``execute`` (and ``create`` / ``release`` when a call keeps state)."""

    default_schema: dict[str, Any] | None = None
    """The schema used when the tool config gives none."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        self.config = dict(config or {})
        if tool_schema is None:
            tool_schema = self.default_schema
        if isinstance(tool_schema, dict):
            tool_schema = ToolSchema(tool_schema)
        if tool_schema is None or not tool_schema.name:
            raise ValueError(f"{type(self).__name__}: a tool needs a schema with function.name")
        self.tool_schema = tool_schema
        self.name = tool_schema.name
        self._instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> ToolSchema:
        """The schema the policy is shown."""
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start one call; ``kwargs`` holds ``create_kwargs`` from the record (and ``image`` when it has one)."""
        iid = instance_id or uuid.uuid4().hex
        create_kwargs = dict(kwargs.pop("create_kwargs", None) or {})
        state = {**kwargs, **create_kwargs}  # the record's create_kwargs (its ground_truth, say) over the defaults
        for key in ("image", "source_image", "image_bounds"):  # ... but never over the images and pixel bounds
            if key in kwargs:  # the agent gives: data cannot make a zoom render at 20000 x 20000 pixels
                state[key] = kwargs[key]
        self._instances[iid] = state
        return iid, ToolResponse()

    def instance(self, instance_id: str) -> dict[str, Any]:
        """The state ``create`` stored for this call."""
        return self._instances.get(instance_id, {})

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run the tool with the policy's arguments: (response, step reward, metrics)."""
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """A reward from the call's state (0 unless a tool says otherwise)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the call's state."""
        self._instances.pop(instance_id, None)
