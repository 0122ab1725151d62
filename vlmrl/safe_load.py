"""Reading checkpoint files without running anything stored in them.

A checkpoint folder is data from disk (copied from another machine, downloaded): loading it must not execute code.
PyTorch's distributed checkpoint (DCP) unpickles its ``.metadata`` file and loads non-tensor items with
``torch.load(weights_only=False)``; both can run code planted in the file. Here:

* ``.metadata`` is unpickled by ``MetadataUnpickler``, which resolves only DCP's own metadata classes (and torch
  dtypes / sizes / layouts, ``pathlib`` paths): any other global (``os.system``, ``builtins.eval``...) is refused;
* byte items (optimizer hyper-parameters) load with ``torch.load(weights_only=True)`` (``SafeLoadPlanner``);
* vlmrl's own per-rank state (scheduler, RNG) is JSON (``vlmrl.rng``), never a pickle.

``safe_dcp_load(state, folder)`` is ``torch.distributed.checkpoint.load`` with both in place.
"""

from __future__ import annotations

import enum
import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.planner import ReadItem


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file refers to something other than plain data; it was not loaded."""


_ALLOWED: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice"},
}
"""module -> names a DCP ``.metadata`` pickle may refer to (torch dtypes are allowed on top)."""


def _enum_member(cls: Any, name: str) -> Any:
    """``getattr`` as a pickle written by Python 3.11.0-3.11.4 uses it: an allowed enum's member by name (those
    versions pickle an enum member as ``getattr(EnumClass, name)``), and nothing else."""
    members = getattr(cls, "__members__", None) if isinstance(cls, type) and issubclass(cls, enum.Enum) else None
    if not isinstance(name, str) or members is None or name not in members:
        raise UnsafeCheckpointError(
            f"the checkpoint's metadata calls getattr({cls!r}, {name!r}), which is not an enum member of a PyTorch "
            "distributed checkpoint; refusing to load it (unpickling it could run code)"
        )
    return members[name]


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds DCP metadata and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):  # only an allowed enum's member (_enum_member)
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"the checkpoint's metadata refers to {module}.{name}, which is not part of a PyTorch distributed "
            "checkpoint; refusing to load it (unpickling it could run code)"
        )


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with the ``.metadata`` pickle read by ``MetadataUnpickler``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = MetadataUnpickler(f).load()
            except UnsafeCheckpointError as e:
                raise UnsafeCheckpointError(f"{path}: {e}") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner with byte items loaded by ``torch.load(weights_only=True)`` (plain data only)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointError(
                f"checkpoint item {read_item.dest_index.fqn!r} is not plain data ({e}); refusing to load it"
            ) from None
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes does
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


_REFUSED = "refusing to load it"


def safe_dcp_load(state: dict[str, Any], folder: str, **planner_kwargs: Any) -> None:
    """``torch.distributed.checkpoint.load(state, checkpoint_id=folder)`` that runs nothing stored in the files.

    Raises ``UnsafeCheckpointError`` for a file that is not plain data, and RuntimeError (not DCP's
    ``CheckpointException``, a BaseException) for any other failure, with the first rank's message."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(**planner_kwargs))
    except CheckpointException as e:
        messages = [str(exc) for exc, _ in e.failures.values()]
        unsafe = next((m for m in messages if _REFUSED in m), None)
        if unsafe is not None:
            start = unsafe.find(str(Path(folder)))
            raise UnsafeCheckpointError(unsafe[start:] if start >= 0 else unsafe) from None
        raise RuntimeError(f"cannot load checkpoint {folder}: {messages[0] if messages else e}") from None
