"""Image / CameraInfo / stamp conversions: round trips for every encoding, padding, endianness."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.data import rosmsg
from fedepth_ros import messages


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _arrays() -> dict[str, np.ndarray]:
    rng = _rng()
    return {
        "rgb8": rng.integers(0, 256, (5, 7, 3), dtype=np.uint8),
        "bgr8": rng.integers(0, 256, (5, 7, 3), dtype=np.uint8),
        "32FC1": rng.uniform(0.1, 80.0, (5, 7)).astype(np.float32),
        "16UC1": rng.integers(0, 65536, (5, 7), dtype=np.uint16),
    }


@pytest.mark.parametrize("encoding", list(rosmsg.ENCODINGS))
@pytest.mark.parametrize("pad", [0, 3, 16])
@pytest.mark.parametrize("bigendian", [False, True])
def test_image_round_trip_with_step_padding(encoding: str, pad: int, bigendian: bool) -> None:
    pixels = _arrays()[encoding]
    spec = rosmsg.ENCODINGS[encoding]
    step = pixels.shape[1] * spec.bytes_per_pixel + pad
    msg = messages.numpy_to_image(pixels, encoding, step=step, is_bigendian=bigendian)
    assert (msg.height, msg.width, msg.step) == (5, 7, step)
    assert msg.is_bigendian == int(bigendian)
    assert len(msg.data) == step * 5
    back = rosmsg.image_to_numpy(msg)
    assert back.dtype == spec.dtype and back.dtype.isnative
    np.testing.assert_array_equal(back, pixels)
    back[0, 0] = 0  # a fresh, writable array


def test_step_padding_bytes_are_zero_and_rows_are_honoured() -> None:
    pixels = np.arange(6, dtype=np.uint16).reshape(2, 3)
    fields = rosmsg.image_fields(pixels, "16UC1", step=8)
    rows = np.frombuffer(fields["data"], np.uint8).reshape(2, 8)
    assert not rows[:, 6:].any()
    assert rows[1, :2].tobytes() == np.array([3], "<u2").tobytes()


def test_big_endian_bytes_on_the_wire() -> None:
    fields = rosmsg.image_fields(np.array([[1.5]], np.float32), "32FC1", is_bigendian=True)
    assert fields["data"] == np.array([1.5], ">f4").tobytes()


def test_reads_foreign_message_objects() -> None:
    """Duck typing: rosbags-style messages (numpy data) and handmade objects read the same."""

    class Msg:
        height, width, encoding, is_bigendian, step = 2, 2, "bgr8", 0, 8
        data = np.array([1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0], np.uint8)

    rgb = rosmsg.image_to_rgb(Msg())
    np.testing.assert_array_equal(rgb[0, 0], [3, 2, 1])
    np.testing.assert_array_equal(rgb[1, 1], [12, 11, 10])


def test_rgb_from_bgr_and_rgb() -> None:
    rgb = _arrays()["rgb8"]
    np.testing.assert_array_equal(rosmsg.image_to_rgb(messages.numpy_to_image(rgb, "rgb8")), rgb)
    bgr_msg = messages.numpy_to_image(rgb[..., ::-1], "bgr8")
    np.testing.assert_array_equal(rosmsg.image_to_rgb(bgr_msg), rgb)
    with pytest.raises(rosmsg.ConversionError, match="colour image"):
        rosmsg.image_to_rgb(messages.numpy_to_image(_arrays()["32FC1"], "32FC1"))


def test_depth_meters_rep118_both_encodings() -> None:
    meters = np.array([[0.0, 1.234], [np.nan, 70.0]], np.float32)
    f32 = messages.meters_to_depth_image(meters, "32FC1")
    raw = rosmsg.image_to_numpy(f32)
    assert np.isnan(raw[0, 0]) and np.isnan(raw[1, 0])  # invalid written as NaN
    np.testing.assert_allclose(rosmsg.depth_to_meters(f32), [[0.0, 1.234], [0.0, 70.0]], rtol=1e-6)
    mm = messages.meters_to_depth_image(meters, "16UC1")
    # 0 = invalid; 70 m does not fit in uint16 millimetres -> invalid too
    np.testing.assert_array_equal(rosmsg.image_to_numpy(mm), [[0, 1234], [0, 0]])
    back = rosmsg.depth_to_meters(mm, invalid=np.nan)
    assert np.isnan(back[0, 0]) and back[0, 1] == pytest.approx(1.234)


def test_negative_and_infinite_32fc1_are_invalid() -> None:
    msg = messages.numpy_to_image(np.array([[-1.0, np.inf, 2.0]], np.float32), "32FC1")
    np.testing.assert_array_equal(rosmsg.depth_to_meters(msg), [[0.0, 0.0, 2.0]])


@pytest.mark.parametrize(
    ("pixels", "encoding", "match"),
    [
        (np.zeros((2, 2, 3), np.uint8), "mono8", "unsupported image encoding 'mono8'"),
        (np.zeros((2, 2), np.uint8), "rgb8", r"shape \(H, W, 3\)"),
        (np.zeros((2, 2, 3), np.float32), "rgb8", "dtype uint8"),
        (np.zeros((2, 2), np.int32), "16UC1", "dtype uint16"),
        (np.zeros((2, 2, 1), np.float32), "32FC1", r"shape \(H, W\)"),
    ],
)
def test_writer_errors(pixels: np.ndarray, encoding: str, match: str) -> None:
    with pytest.raises(rosmsg.ConversionError, match=match):
        rosmsg.image_fields(pixels, encoding)


def test_step_smaller_than_row_is_rejected() -> None:
    with pytest.raises(rosmsg.ConversionError, match="step 5 is smaller than one row"):
        rosmsg.image_fields(np.zeros((2, 2, 3), np.uint8), "rgb8", step=5)


def test_reader_errors_on_size_mismatch_and_unknown_encoding() -> None:
    msg = messages.numpy_to_image(np.zeros((4, 4), np.float32), "32FC1")
    msg.height = 5
    with pytest.raises(rosmsg.ConversionError, match="expected 80 data bytes, got 64"):
        rosmsg.image_to_numpy(msg)
    msg.height, msg.encoding = 4, "yuv422"
    with pytest.raises(rosmsg.ConversionError, match="unsupported image encoding 'yuv422'"):
        rosmsg.image_to_numpy(msg)
    msg.encoding, msg.step = "32FC1", 8
    with pytest.raises(rosmsg.ConversionError, match="step 8 is smaller"):
        rosmsg.image_to_numpy(msg)


def test_camera_info_round_trip() -> None:
    K = np.array([[500.0, 0.0, 320.5], [0.0, 510.0, 240.5], [0.0, 0.0, 1.0]])
    info = messages.camera_info_from_k(K, 640, 480, stamp_ns=3_000_000_007, frame_id="cam")
    assert (info.width, info.height, info.distortion_model) == (640, 480, "plumb_bob")
    assert rosmsg.stamp_to_ns(info.header.stamp) == 3_000_000_007 and info.header.frame_id == "cam"
    np.testing.assert_array_equal(rosmsg.k_from_camera_info(info), K)
    np.testing.assert_array_equal(np.reshape(info.p, (3, 4))[:, :3], K)
    np.testing.assert_array_equal(np.reshape(info.r, (3, 3)), np.eye(3))
    assert list(info.d) == [0.0] * 5


def test_camera_info_errors() -> None:
    with pytest.raises(rosmsg.ConversionError, match="3x3"):
        rosmsg.camera_info_fields(np.eye(2), 4, 4)
    with pytest.raises(rosmsg.ConversionError, match="focal"):
        rosmsg.camera_info_fields(np.diag([0.0, 1.0, 1.0]), 4, 4)
    with pytest.raises(rosmsg.ConversionError, match="positive"):
        rosmsg.camera_info_fields(np.eye(3), 0, 4)

    class Uncalibrated:
        height, width, k = 4, 4, [0.0] * 9

    with pytest.raises(rosmsg.ConversionError, match="uncalibrated"):
        rosmsg.k_from_camera_info(Uncalibrated())


@pytest.mark.parametrize("ns", [0, 1, 999_999_999, 1_000_000_000, 1_700_000_000_123_456_789])
def test_stamps_round_trip(ns: int) -> None:
    stamp = messages.ns_to_stamp(ns)
    assert 0 <= stamp.nanosec < 1_000_000_000
    assert rosmsg.stamp_to_ns(stamp) == ns


def test_stamp_errors() -> None:
    with pytest.raises(rosmsg.ConversionError, match="negative"):
        rosmsg.split_ns(-1)
    with pytest.raises(rosmsg.ConversionError, match="overflows"):
        rosmsg.split_ns(2**31 * 1_000_000_000)
