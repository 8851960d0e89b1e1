"""Tensor layouts and byte streams: how weights are cut into chunks, rebuilt and checked.

A payload is an ordered list of named groups of named tensors (group ``state`` first: the model;
then algorithm extras such as SCAFFOLD's control variates). Its bytes are the tensors' raw
little-endian C-order bytes, concatenated in layout order. The sender cuts them into chunks of
at most ``chunk_bytes`` without copying a whole tensor; the receiver either assembles them into
preallocated arrays (:class:`Assembler`, one copy of the model) or checks them as they pass
(:class:`StreamChecker`: sizes, finite values, update norm) while they are spilled to disk.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# the group holding the model itself is fedepth.updates.STATE; any other group is an extra
from fedepth.updates import (
    STATE,
    UpdateBounds,
    UpdateRejectedError,
    first_nonfinite,
    nonfinite_message,
)
from fedepth_coordinator.errors import InvalidArgumentError, shown

#: safetensors dtype names and the little-endian numpy dtypes they map to.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {dt.str: name for name, dt in DTYPES.items()}

#: Where a coordinator's norm bounds are configured (named in a rejection).
BOUND_SETTINGS = "validation.max_update_norm, validation.max_group_norms"

#: Names of extra groups (they become part of on-disk keys): short and plain.
GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def dtype_name(dtype: np.dtype) -> str:
    """The safetensors name of a numpy dtype (byte order ignored)."""
    dt = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
    try:
        return _NAMES[dt.str]
    except KeyError:
        raise ValueError(
            f"dtype {dtype} cannot travel as a tensor; use one of {', '.join(DTYPES)}"
        ) from None


@dataclass(frozen=True)
class TensorSpec:
    """Name, safetensors dtype name and shape of one tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidArgumentError(
                f"tensor {shown(self.name)}: unknown dtype {self.dtype!r}; use one of "
                f"{', '.join(DTYPES)}"
            )
        if any(d < 0 for d in self.shape):
            raise InvalidArgumentError(
                f"tensor {shown(self.name)}: negative dimension in {self.shape}"
            )

    @classmethod
    def of(cls, name: str, array: np.ndarray) -> TensorSpec:
        return cls(name, dtype_name(array.dtype), tuple(int(d) for d in array.shape))

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.np_dtype.itemsize


@dataclass(frozen=True)
class Group:
    """A named, ordered group of tensors."""

    name: str
    tensors: tuple[TensorSpec, ...]

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def spec(self, name: str) -> TensorSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class Layout:
    """The ordered groups of a payload; its bytes are the tensors in this order."""

    groups: tuple[Group, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for g in self.groups:
            if g.name in seen:
                raise InvalidArgumentError(f"tensor group {shown(g.name)} appears twice")
            seen.add(g.name)
            names, unique = g.names(), set()
            dup: list[str] = []
            for n in names:  # linear: a header of many names must not cost quadratic time
                if n in unique:
                    dup.append(n)
                unique.add(n)
            if dup:
                raise InvalidArgumentError(
                    f"group {shown(g.name)} repeats tensor names "
                    f"{[shown(n, 40) for n in sorted(set(dup))[:5]]}"
                )

    @classmethod
    def of(cls, groups: Mapping[str, Mapping[str, np.ndarray]]) -> Layout:
        """The layout of groups of arrays, in mapping order."""
        return cls(
            tuple(
                Group(gname, tuple(TensorSpec.of(n, np.asarray(a)) for n, a in tensors.items()))
                for gname, tensors in groups.items()
            )
        )

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for g in self.groups for t in g.tensors)

    @property
    def num_tensors(self) -> int:
        return sum(len(g.tensors) for g in self.groups)

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def entries(self) -> Iterator[tuple[str, TensorSpec, int]]:
        """(group name, spec, byte offset) of every tensor, in stream order."""
        offset = 0
        for g in self.groups:
            for t in g.tensors:
                yield g.name, t, offset
                offset += t.nbytes


def _le_bytes(array: np.ndarray) -> memoryview:
    """A byte view of an array in little-endian C order (copies only when it must)."""
    a = np.asarray(array)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data


def iter_chunks(
    groups: Sequence[Mapping[str, np.ndarray]],
    chunk_bytes: int,
    *,
    frame: Callable[[int], bytes] | None = None,
) -> Iterator[bytes]:
    """The concatenated tensor bytes of ``groups`` (in order) cut into chunks of ``chunk_bytes``.

    Every chunk but the last is exactly ``chunk_bytes`` long; each is built from views of the
    arrays, so at most one chunk is copied at a time. With ``frame``, each chunk is preceded by
    ``frame(len(chunk))`` in the same copy (see :mod:`fedepth_coordinator.wire`).
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")

    def emit(pieces: list[memoryview], n: int) -> bytes:
        return b"".join([frame(n), *pieces] if frame is not None else pieces)

    pending: list[memoryview] = []
    filled = 0
    for tensors in groups:
        for array in tensors.values():
            view = _le_bytes(array)
            pos = 0
            while pos < len(view):
                take = min(chunk_bytes - filled, len(view) - pos)
                pending.append(view[pos : pos + take])
                filled += take
                pos += take
                if filled == chunk_bytes:
                    yield emit(pending, filled)
                    pending, filled = [], 0
    if pending:
        yield emit(pending, filled)


class Assembler:
    """Rebuilds the arrays of a layout from its chunks, writing each byte once into place."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.total = layout.total_bytes
        # np.empty, not bytearray: no zero-fill pass over memory the chunks overwrite anyway
        self._buffer = np.empty(self.total, dtype=np.uint8)
        self._view = self._buffer.data
        self.received = 0

    def feed(self, chunk: bytes | memoryview) -> None:
        end = self.received + len(chunk)
        if end > self.total:
            raise InvalidArgumentError(
                f"stream carries more than the {self.total} bytes its header announced"
            )
        self._view[self.received : end] = chunk
        self.received = end

    def finish(self) -> dict[str, dict[str, np.ndarray]]:
        """The groups of arrays; raises when the stream ended early."""
        if self.received != self.total:
            raise InvalidArgumentError(
                f"stream ended after {self.received} of {self.total} bytes (truncated)"
            )
        out: dict[str, dict[str, np.ndarray]] = {g.name: {} for g in self.layout.groups}
        for gname, spec, offset in self.layout.entries():
            raw = self._buffer[offset : offset + spec.nbytes]
            out[gname][spec.name] = raw.view(spec.np_dtype).reshape(spec.shape)
        return out


def assemble(
    layout: Layout, chunks: Iterable[bytes | memoryview]
) -> dict[str, dict[str, np.ndarray]]:
    """Arrays of a layout from all its chunks."""
    asm = Assembler(layout)
    for chunk in chunks:
        asm.feed(chunk)
    return asm.finish()


class StreamChecker:
    """Checks an upload's bytes as they pass, tensor by tensor, without keeping them.

    Rejects (``InvalidArgumentError``) more or fewer bytes than the layout announces and NaN or Inf
    in floating tensors; with ``reference`` (the model the robot downloaded) and ``max_norm``,
    also rejects a state whose L2 distance to the reference exceeds the bound, and with
    ``max_norm`` (or its entry in ``group_norms``) an extra group whose L2 norm exceeds it
    (extras are deltas: control-variate changes and the like). ``group_norms`` bounds groups by
    name (``state`` included) and overrides ``max_norm``.

    Each chunk is checked in place as numpy views of its bytes; only an element split across
    two chunks is copied (its few bytes), and a view numpy cannot read aligned is copied once.
    """

    def __init__(
        self,
        layout: Layout,
        *,
        reference: Mapping[str, np.ndarray] | None = None,
        max_norm: float | None = None,
        group_norms: Mapping[str, float] | None = None,
        bounds: UpdateBounds | None = None,
    ) -> None:
        self.layout = layout
        self.total = layout.total_bytes
        self.received = 0
        self.reference = reference
        if bounds is None:
            bounds = UpdateBounds(max_norm, dict(group_norms or {}), settings=BOUND_SETTINGS)
        self.max_norm = bounds.max_norm
        self.update_bounds = bounds
        #: the bound of every group (None: unbounded); the state needs a reference to be bounded
        self.bounds: dict[str, float | None] = {
            g.name: bounds.bound(g.name) for g in layout.groups
        }
        if reference is None:
            self.bounds[STATE] = None
        #: squared L2 norm of every group (the state's: its distance to the reference)
        self.sq_norms: dict[str, float] = {g.name: 0.0 for g in layout.groups}
        self._entries = list(layout.entries())
        self._index = 0  # tensor being received
        self._done = 0  # bytes of that tensor already seen
        self._carry = b""  # first bytes of an element split across chunks

    def feed(self, chunk: bytes | memoryview) -> None:
        if self.received + len(chunk) > self.total:
            raise InvalidArgumentError(
                f"upload carries more than the {self.total} bytes its header announced"
            )
        self.received += len(chunk)
        view = memoryview(chunk).cast("B")
        while len(view):
            gname, spec, _ = self._entries[self._index]
            take = min(spec.nbytes - self._done, len(view))
            self._check_piece(gname, spec, view[:take])
            view = view[take:]
            self._done += take
            if self._done == spec.nbytes:
                self._index += 1
                self._done = 0
                self._carry = b""

    def _check_piece(self, gname: str, spec: TensorSpec, piece: memoryview) -> None:
        """Check ``piece``, the bytes of ``spec`` from byte ``self._done`` on."""
        dtype = spec.np_dtype
        if dtype.kind != "f":
            return
        size = dtype.itemsize
        head = -self._done % size  # bytes that complete an element begun in the last chunk
        if head:
            if len(piece) < head:
                self._carry += piece
                return
            split = np.frombuffer(self._carry + piece[:head], dtype)
            self._check_values(gname, spec, split, self._done // size)
            self._carry = b""
            piece = piece[head:]
        whole = len(piece) // size
        if whole:
            values = np.frombuffer(piece, dtype, whole)
            self._check_values(gname, spec, values, (self._done + head) // size)
        self._carry = bytes(piece[whole * size :])

    def _check_values(self, gname: str, spec: TensorSpec, values: np.ndarray, first: int) -> None:
        """Check elements ``first ..`` of tensor ``spec``."""
        if not values.flags.aligned:  # numpy's unaligned loops are ~10x slower than a copy
            values = values.copy()
        nonfinite = first_nonfinite(values)
        if nonfinite is not None:
            raise InvalidArgumentError(nonfinite_message(gname, spec.name, first + nonfinite))
        if self.bounds.get(gname) is None:
            return
        if gname == STATE:
            assert self.reference is not None
            ref = np.asarray(self.reference[spec.name]).reshape(-1)[first : first + values.size]
            diff = np.subtract(values, ref, dtype=np.float64)
        else:
            diff = values.astype(np.float64)
        # einsum, not np.dot: BLAS threads for one dot product are slow on a busy machine
        self.sq_norms[gname] += float(np.einsum("i,i->", diff, diff))

    @property
    def sq_distance(self) -> float:
        """Squared L2 distance of the state to the reference (0 when not bounded)."""
        return self.sq_norms.get(STATE, 0.0)

    def finish(self) -> None:
        if self.received != self.total:
            raise InvalidArgumentError(
                f"upload ended after {self.received} of {self.total} bytes (truncated stream); "
                "resend the whole update"
            )
        bounded = {g: sq for g, sq in self.sq_norms.items() if self.bounds[g] is not None}
        try:
            self.update_bounds.check(bounded)
        except UpdateRejectedError as exc:
            raise InvalidArgumentError(str(exc)) from None


def check_matches(layout: Layout, expected: Group, *, max_extra_groups: int) -> None:
    """An upload's layout against the model the robot was given (names, shapes, dtypes).

    The ``state`` group must hold exactly the model's tensors (in any order); each extra group
    (at most ``max_extra_groups``) may hold a subset of them, with the same shapes and dtypes
    (control variates and similar per-parameter state).
    """
    if not layout.groups or layout.groups[0].name != STATE:
        raise InvalidArgumentError(f"an update must start with the {STATE!r} group")
    by_name = {t.name: t for t in expected.tensors}
    state = layout.groups[0]
    got = set(state.names())
    missing, unexpected = sorted(set(by_name) - got), sorted(got - set(by_name))
    if missing or unexpected:
        raise InvalidArgumentError(
            f"update tensor names differ from the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}; upload the tensors you downloaded"
        )
    extras = layout.groups[1:]
    if len(extras) > max_extra_groups:
        raise InvalidArgumentError(
            f"{len(extras)} extra groups sent; at most {max_extra_groups} are accepted"
        )
    for g in layout.groups:
        if g.name != STATE and GROUP_NAME.fullmatch(g.name) is None:
            raise InvalidArgumentError(
                f"extra group name {shown(g.name)} must match {GROUP_NAME.pattern} and not be "
                f"{STATE!r}"
            )
        for t in g.tensors:
            ref = by_name.get(t.name)
            if ref is None:
                raise InvalidArgumentError(
                    f"extra group {shown(g.name)}: tensor {shown(t.name)} is not a model tensor"
                )
            if t.shape != ref.shape or t.dtype != ref.dtype:
                raise InvalidArgumentError(
                    f"tensor {g.name}/{t.name}: got {t.dtype}{list(t.shape)}, the model has "
                    f"{ref.dtype}{list(ref.shape)}"
                )
