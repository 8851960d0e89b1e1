"""Weight blobs as safetensors files: written as a stream, read back tensor by tensor.

A blob holds a :class:`~fedepth_coordinator.tensors.Layout` (ordered groups of tensors). Each
tensor is stored under the key ``group/name`` and the group structure is kept in the header's
``__metadata__`` (``fedepth.layout``), so any safetensors reader can open the file and this
module can rebuild the groups exactly. :class:`LazyGroup` is a read-only mapping that reads a
tensor from the store each time it is asked for one: aggregation over spilled uploads then holds
one tensor per update at a time, not whole models.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from fedepth.models.state import State
from fedepth_coordinator.state.base import BlobWriter, Store
from fedepth_coordinator.tensors import Group, Layout, TensorSpec, iter_chunks

_LAYOUT_KEY = "fedepth.layout"


def _flat_key(group: str, name: str) -> str:
    return f"{group}/{name}"


def header_bytes(layout: Layout) -> bytes:
    """The safetensors header (length prefix + JSON, padded to 8 bytes) of a layout."""
    entries: dict[str, object] = {}
    for gname, spec, offset in layout.entries():
        key = _flat_key(gname, spec.name)
        if key in entries:
            raise ValueError(f"tensor key {key!r} is ambiguous in this layout")
        entries[key] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
    groups = [[g.name, g.names()] for g in layout.groups]
    entries["__metadata__"] = {_LAYOUT_KEY: json.dumps(groups)}
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def start_blob(store: Store, key: str, layout: Layout) -> BlobWriter:
    """A writer for blob ``key`` with its header written; the caller writes the tensor bytes."""
    header = header_bytes(layout)
    writer = store.blob_writer(key, size=len(header) + layout.total_bytes)
    writer.write(header)
    return writer


def write_blob(
    store: Store,
    key: str,
    groups: Mapping[str, Mapping[str, np.ndarray]],
    *,
    chunk_bytes: int = 1 << 22,
) -> Layout:
    """Write groups of arrays as blob ``key`` (atomically) and return their layout."""
    layout = Layout.of(groups)
    with start_blob(store, key, layout) as writer:
        for chunk in iter_chunks(list(groups.values()), chunk_bytes):
            writer.write(chunk)
        writer.commit()
    return layout


class BlobReader:
    """Reads a blob's layout once, then any tensor on demand.

    The blob is first checked against the checksum recorded when it was written
    (:class:`~fedepth_coordinator.state.base.CorruptBlobError` if it does not match), so that
    bytes changed on disk are never aggregated or served; ``verify=False`` skips that (a blob
    just written by this process).
    """

    def __init__(self, store: Store, key: str, *, verify: bool = True) -> None:
        self.store = store
        self.key = key
        if verify:
            store.verify_blob(key)
        (n,) = struct.unpack("<Q", bytes(store.read_blob(key, 0, 8)))
        header = json.loads(bytes(store.read_blob(key, 8, n)))
        self.data_start = 8 + n
        groups = json.loads(header["__metadata__"][_LAYOUT_KEY])
        self._offsets: dict[tuple[str, str], int] = {}
        built = []
        for gname, names in groups:
            specs = []
            for name in names:
                e = header[_flat_key(gname, name)]
                specs.append(TensorSpec(name, e["dtype"], tuple(e["shape"])))
                self._offsets[(gname, name)] = int(e["data_offsets"][0])
            built.append(Group(gname, tuple(specs)))
        self.layout = Layout(tuple(built))

    def has(self, group: str, name: str) -> bool:
        return (group, name) in self._offsets

    def tensor(self, group: str, name: str) -> np.ndarray:
        spec = self.layout.group(group).spec(name)
        raw = self.store.read_blob(
            self.key, self.data_start + self._offsets[(group, name)], spec.nbytes
        )
        return np.frombuffer(raw, spec.np_dtype, spec.numel).reshape(spec.shape)

    def lazy(self, group: str, order: Iterable[str] | None = None) -> LazyGroup:
        """A mapping over one group that reads each tensor when asked (keys in ``order``)."""
        names = self.layout.group(group).names() if order is None else list(order)
        return LazyGroup(self, group, names)

    def read_all(self) -> dict[str, State]:
        return {g.name: {n: self.tensor(g.name, n) for n in g.names()} for g in self.layout.groups}


class LazyGroup(Mapping[str, np.ndarray]):
    """Read-only mapping name -> array backed by a blob; nothing is cached."""

    def __init__(self, reader: BlobReader, group: str, names: list[str]) -> None:
        self._reader = reader
        self._group = group
        self._names = names
        known = set(reader.layout.group(group).names())
        if set(names) != known:
            raise ValueError(f"blob {reader.key!r} group {group!r} holds other tensors")

    def __getitem__(self, name: str) -> np.ndarray:
        if not self._reader.has(self._group, name):
            raise KeyError(name)
        return self._reader.tensor(self._group, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
