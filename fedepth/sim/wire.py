"""What the coordinator's wire format costs a round, measured by doing it.

The bytes of a payload; each distinct download encoded once; every upload encoded, decoded and
checked for finite values, as the coordinator does (see fedepth_coordinator.tensors).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from fedepth.updates import first_nonfinite


def state_nbytes(state: Mapping[str, np.ndarray]) -> int:
    return int(sum(np.asarray(t).nbytes for t in state.values()))


def _wire_encode(groups: Sequence[Mapping[str, np.ndarray]]) -> bytes:
    """The bytes the coordinator streams for a payload: every tensor's raw little-endian C-order
    bytes, concatenated (one copy; see fedepth_coordinator.tensors)."""
    return b"".join(
        np.ascontiguousarray(a, dtype=np.asarray(a).dtype.newbyteorder("<")).reshape(-1).data
        for g in groups
        for a in g.values()
    )


def _wire_decode(payload: bytes, like: Sequence[Mapping[str, np.ndarray]]) -> bool:
    """What the coordinator does with an upload: rebuild the arrays from the bytes (one copy
    into place) and check that every float is finite before it may touch an aggregate.
    False when the coordinator would reject the upload."""
    buf = np.frombuffer(payload, dtype=np.uint8).copy()
    offset, finite = 0, True
    for g in like:
        for a in g.values():
            arr = np.asarray(a)
            view = buf[offset : offset + arr.nbytes].view(arr.dtype.newbyteorder("<"))
            offset += arr.nbytes
            finite &= first_nonfinite(view) is None
    return finite


def distinct_payloads(
    payloads: Sequence[Sequence[Mapping[str, np.ndarray]]],
) -> list[Sequence[Mapping[str, np.ndarray]]]:
    """The non-empty payloads that differ in at least one array object, first occurrence kept:
    a coordinator encodes a model once however many robots download it."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for groups in payloads:
        key = tuple(id(a) for g in groups for a in g.values())
        if key and key not in seen:
            seen.add(key)
            out.append(groups)
    return out


def wire_seconds(
    downloads: Sequence[Sequence[Mapping[str, np.ndarray]]],
    uploads: Sequence[Sequence[Mapping[str, np.ndarray]]],
) -> tuple[float, list[int]]:
    """Seconds the coordinator's wire format costs for one round, measured by doing it: encode
    each distinct download payload once (robots that get the same model share one stream), and
    encode + decode + check every upload. Also the indices of the uploads the coordinator would
    reject for non-finite values."""
    t0 = time.perf_counter()
    rejected = []
    for groups in distinct_payloads(downloads):
        _wire_encode(groups)
    for i, groups in enumerate(uploads):
        if any(groups) and not _wire_decode(_wire_encode(groups), groups):
            rejected.append(i)
    return time.perf_counter() - t0, rejected
