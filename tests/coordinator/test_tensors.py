"""Chunking, assembly, the wire fast path and stream checks, on small arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedepth_coordinator import wire
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator.errors import InvalidArgumentError
from fedepth_coordinator.tensors import (
    DTYPES,
    Group,
    Layout,
    StreamChecker,
    TensorSpec,
    assemble,
    check_matches,
    iter_chunks,
)


def _groups(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        "state": {
            "a": rng.standard_normal((3, 5)).astype(np.float32),
            "b": rng.integers(0, 9, 7).astype(np.int64),
            "c": rng.standard_normal(3).astype(np.float16),  # odd byte count: misaligns the rest
            "d": np.array(2.5, dtype=np.float64),
            "e": np.zeros((0, 4), dtype=np.float32),
        },
        "cv": {"a": rng.standard_normal((3, 5)).astype(np.float32)},
    }


@settings(max_examples=40, deadline=None)
@given(chunk=st.integers(1, 200))
def test_chunks_reassemble_exactly(chunk: int) -> None:
    groups = _groups()
    layout = Layout.of(groups)
    chunks = list(iter_chunks(list(groups.values()), chunk))
    assert all(len(c) == chunk for c in chunks[:-1]) and 0 < len(chunks[-1]) <= chunk
    assert sum(map(len, chunks)) == layout.total_bytes
    out = assemble(layout, chunks)
    for g, tensors in groups.items():
        assert list(out[g]) == list(tensors)
        for name, arr in tensors.items():
            assert out[g][name].dtype == arr.dtype.newbyteorder("<")
            np.testing.assert_array_equal(out[g][name], arr)


def test_big_endian_arrays_travel_little_endian() -> None:
    arr = np.arange(4, dtype=">f4")
    chunk = next(iter_chunks([{"x": arr}], 1024))
    assert chunk == np.arange(4, dtype="<f4").tobytes()


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=3000))
def test_wire_frames_equal_protobuf_and_decode_without_copy(data: bytes) -> None:
    encoded = wire.frame(len(data)) + data
    for cls in (pb.DownloadMessage, pb.UploadMessage, pb.RouteMessage):
        assert encoded == cls(data=data).SerializeToString()
        decoded = wire.deserializer(cls)(encoded)
        assert isinstance(decoded, memoryview) and bytes(decoded) == data
    framed = next(
        iter_chunks([{"x": np.frombuffer(data + b"\0", np.uint8)}], 10_000, frame=wire.frame)
    )
    assert framed == wire.frame(len(data) + 1) + data + b"\0"


def test_wire_deserializer_parses_other_messages_with_protobuf() -> None:
    header = pb.DownloadMessage(header=pb.DownloadHeader(round=3, total_bytes=12))
    parsed = wire.deserializer(pb.DownloadMessage)(header.SerializeToString())
    assert isinstance(parsed, pb.DownloadMessage) and parsed.header.round == 3
    # a data field followed by another field is not the fast path: protobuf decides (last wins)
    mixed = pb.DownloadMessage(data=b"xy").SerializeToString() + header.SerializeToString()
    parsed = wire.deserializer(pb.DownloadMessage)(mixed)
    assert isinstance(parsed, pb.DownloadMessage) and parsed.WhichOneof("body") == "header"
    assert wire.serialize(header) == header.SerializeToString()


def _feed_all(
    checker: StreamChecker, groups: dict[str, dict[str, np.ndarray]], chunk: int
) -> None:
    for c in iter_chunks(list(groups.values()), chunk):
        checker.feed(c)
    checker.finish()


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_checker_finds_nan_wherever_the_chunks_split(chunk: int) -> None:
    groups = _groups()
    _feed_all(StreamChecker(Layout.of(groups)), groups, chunk)  # clean: passes
    groups["state"]["a"][2, 4] = np.nan
    with pytest.raises(
        InvalidArgumentError, match=r"state/a has a NaN or Inf value \(element 14\)"
    ):
        _feed_all(StreamChecker(Layout.of(groups)), groups, chunk)
    groups = _groups()
    groups["cv"]["a"][0, 0] = -np.inf
    with pytest.raises(InvalidArgumentError, match="cv/a"):
        _feed_all(StreamChecker(Layout.of(groups)), groups, chunk)


def test_checker_rejects_truncated_and_overlong_streams() -> None:
    groups = _groups()
    layout = Layout.of(groups)
    data = b"".join(iter_chunks(list(groups.values()), 1 << 20))
    checker = StreamChecker(layout)
    checker.feed(data[:-1])
    with pytest.raises(InvalidArgumentError, match="truncated"):
        checker.finish()
    checker = StreamChecker(layout)
    with pytest.raises(InvalidArgumentError, match="more than"):
        checker.feed(data + b"x")


def test_checker_norm_bound_measures_distance_to_the_downloaded_model() -> None:
    ref = {"w": np.zeros(4, np.float32), "n": np.zeros(2, np.int64)}
    upd = {"w": np.array([3.0, 4.0, 0, 0], np.float32), "n": np.array([100, 100])}
    layout = Layout.of({"state": upd})
    _feed_all(StreamChecker(layout, reference=ref, max_norm=5.0), {"state": upd}, 5)
    with pytest.raises(InvalidArgumentError, match=r"norm 5 exceeds the bound 4.9"):
        _feed_all(StreamChecker(layout, reference=ref, max_norm=4.9), {"state": upd}, 5)


def test_check_matches_names_shapes_dtypes_and_extras() -> None:
    model = Group("state", (TensorSpec("a", "F32", (2,)), TensorSpec("b", "I64", ())))
    ok = Layout(
        (
            Group("state", (TensorSpec("b", "I64", ()), TensorSpec("a", "F32", (2,)))),
            Group("cv", (TensorSpec("a", "F32", (2,)),)),
        )
    )
    check_matches(ok, model, max_extra_groups=1)
    with pytest.raises(InvalidArgumentError, match="at most 0"):
        check_matches(ok, model, max_extra_groups=0)
    cases = {
        "missing": Layout((Group("state", (TensorSpec("a", "F32", (2,)),)),)),
        "got F32\\[3\\]": Layout(
            (Group("state", (TensorSpec("a", "F32", (3,)), TensorSpec("b", "I64", ()))),)
        ),
        "got F64\\[2\\]": Layout(
            (Group("state", (TensorSpec("a", "F64", (2,)), TensorSpec("b", "I64", ()))),)
        ),
        "not a model tensor": Layout(
            (
                Group("state", (TensorSpec("a", "F32", (2,)), TensorSpec("b", "I64", ()))),
                Group("cv", (TensorSpec("zz", "F32", (2,)),)),
            )
        ),
    }
    for message, layout in cases.items():
        with pytest.raises(InvalidArgumentError, match=message):
            check_matches(layout, model, max_extra_groups=2)


def test_specs_reject_unknown_dtypes_and_repeated_names() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown dtype"):
        TensorSpec("x", "F128", (1,))
    with pytest.raises(InvalidArgumentError, match="repeats tensor names"):
        Layout((Group("state", (TensorSpec("x", "F32", ()), TensorSpec("x", "F32", ()))),))
    assert set(DTYPES) >= {"F32", "F16", "I64", "BOOL"}


def _first_bad(groups: dict[str, dict[str, np.ndarray]]) -> tuple[str, int] | None:
    """``group/name`` and element index of the first NaN or Inf in stream order."""
    for gname, tensors in groups.items():
        for name, arr in tensors.items():
            if arr.dtype.kind == "f":
                bad = np.flatnonzero(~np.isfinite(arr.reshape(-1)))
                if bad.size:
                    return f"{gname}/{name}", int(bad[0])
    return None


@settings(max_examples=150, deadline=None)
@given(
    chunk=st.integers(1, 70),
    lead=st.integers(0, 3),
    poison=st.lists(
        st.tuples(st.sampled_from(["h", "f", "d", "cv"]), st.integers(0, 40), st.integers(0, 2)),
        max_size=3,
    ),
    wire_offset=st.booleans(),
)
def test_checker_agrees_with_isfinite_on_any_split(
    chunk: int, lead: int, poison: list[tuple[str, int, int]], wire_offset: bool
) -> None:
    """Every float dtype, chunks that split elements anywhere, odd offsets (``lead`` int8 bytes
    first), views at the unaligned offsets the wire gives: the checker rejects exactly the
    streams with a NaN or Inf, naming the first one, and sums the same squared distance."""
    rng = np.random.default_rng(chunk * 10 + lead)
    state = {
        "lead": np.arange(lead, dtype=np.int8),
        "h": rng.standard_normal(41).astype(np.float16),
        "f": rng.standard_normal((5, 9)).astype(np.float32),
        "d": rng.standard_normal(41),
        "i": np.arange(7, dtype=np.int64),
    }
    groups = {"state": state, "cv": {"f": rng.standard_normal((5, 9)).astype(np.float32)}}
    reference = {k: np.zeros_like(v) for k, v in state.items()}
    for target, index, kind in poison:
        arr = groups["cv"]["f"] if target == "cv" else state[target]
        arr.reshape(-1)[index] = [np.nan, np.inf, -np.inf][kind]
    layout = Layout.of(groups)
    checker = StreamChecker(layout, reference=reference, max_norm=1e9)
    expected = _first_bad(groups)
    parse = wire.deserializer(pb.UploadMessage)

    def feed_all() -> None:
        for c in iter_chunks(list(groups.values()), chunk, frame=wire.frame):
            data = parse(c) if wire_offset else c[len(wire.frame(len(c))) :]
            assert isinstance(data, memoryview | bytes)
            checker.feed(data)
        checker.finish()

    if expected is None:
        feed_all()
        want = sum(
            float(np.sum(v.astype(np.float64) ** 2)) for v in state.values() if v.dtype.kind == "f"
        )
        assert checker.sq_distance == pytest.approx(want, rel=1e-12)
    else:
        name, index = expected
        with pytest.raises(
            InvalidArgumentError, match=rf"{name} has a NaN or Inf value \(element {index}\)"
        ):
            feed_all()


def test_checker_norm_of_float16_and_misaligned_float64_matches_numpy() -> None:
    ref = {"h": np.full(9, 0.5, np.float16), "d": np.zeros(5)}
    upd = {"h": np.arange(9, dtype=np.float16), "d": np.arange(5.0)}
    layout = Layout.of({"state": upd})
    for chunk in (1, 3, 5, 1000):
        checker = StreamChecker(layout, reference=ref, max_norm=100.0)
        _feed_all(checker, {"state": upd}, chunk)
        want = float(np.sum((upd["h"] - 0.5).astype(np.float64) ** 2) + np.sum(upd["d"] ** 2))
        assert checker.sq_distance == pytest.approx(want, rel=1e-12)
