"""sensor_msgs Image / CameraInfo fields <-> numpy, and ROS stamps <-> integer nanoseconds.

No ROS here: the readers are duck-typed, so they accept any object with the message's fields
(rclpy messages such as ``sensor_msgs.msg.Image``, rosbags' deserialized dataclasses, handmade
objects), and the ``*_fields`` functions return plain field dicts that either message flavour
is built from. The rclpy message builders are :mod:`fedepth_ros.messages`; the bag reader and
writer (:mod:`fedepth.data.bags`, :mod:`fedepth.data.bag_writer`) use these functions with
rosbags' messages.

Depth conventions (REP 118): ``32FC1`` is metres with NaN for "no return"; ``16UC1`` is
millimetres with 0 for "no return". The library-side convention (``fedepth`` frames) is float32
metres with 0 for invalid; :func:`depth_to_meters` and :func:`depth_image_fields` translate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

NS_PER_S = 1_000_000_000


class ConversionError(ValueError):
    """An image or camera message cannot be converted (encoding, shape or size problem)."""


@dataclass(frozen=True)
class EncodingSpec:
    """Element type and channel count of one sensor_msgs image encoding."""

    dtype: np.dtype[Any]
    channels: int

    @property
    def bytes_per_pixel(self) -> int:
        return self.dtype.itemsize * self.channels


ENCODINGS: Mapping[str, EncodingSpec] = {
    "rgb8": EncodingSpec(np.dtype(np.uint8), 3),
    "bgr8": EncodingSpec(np.dtype(np.uint8), 3),
    "32FC1": EncodingSpec(np.dtype(np.float32), 1),
    "16UC1": EncodingSpec(np.dtype(np.uint16), 1),
}
DEPTH_ENCODINGS = ("32FC1", "16UC1")
COLOR_ENCODINGS = ("rgb8", "bgr8")


class StampLike(Protocol):
    """builtin_interfaces/Time: ``sec`` and ``nanosec``."""

    sec: int
    nanosec: int


class ImageLike(Protocol):
    """The fields of sensor_msgs/Image that the readers use."""

    height: int
    width: int
    encoding: str
    is_bigendian: int
    step: int
    data: Any


class CameraInfoLike(Protocol):
    """The fields of sensor_msgs/CameraInfo that the readers use."""

    height: int
    width: int
    k: Any


def _spec(encoding: str) -> EncodingSpec:
    try:
        return ENCODINGS[encoding]
    except KeyError:
        raise ConversionError(
            f"unsupported image encoding {encoding!r} (supported: {', '.join(ENCODINGS)})"
        ) from None


# ---------------------------------------------------------------- stamps


def split_ns(stamp_ns: int) -> tuple[int, int]:
    """Integer nanoseconds -> (sec, nanosec) with 0 <= nanosec < 1e9."""
    stamp_ns = int(stamp_ns)
    if stamp_ns < 0:
        raise ConversionError(f"negative stamp {stamp_ns} ns cannot be a ROS time")
    sec, nanosec = divmod(stamp_ns, NS_PER_S)
    if sec >= 2**31:
        raise ConversionError(f"stamp {stamp_ns} ns overflows builtin_interfaces/Time.sec")
    return sec, nanosec


def stamp_to_ns(stamp: StampLike) -> int:
    """builtin_interfaces/Time (or anything with sec, nanosec) -> integer nanoseconds."""
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


# ---------------------------------------------------------------- images -> numpy


def image_to_numpy(msg: ImageLike) -> np.ndarray:
    """Image message -> a new native-endian array: (H, W, 3) for rgb8/bgr8, (H, W) otherwise.

    Honours ``step`` (row padding is dropped) and ``is_bigendian``. Channel order is the
    message's own (see :func:`image_to_rgb`).
    """
    spec = _spec(msg.encoding)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    row_bytes = width * spec.bytes_per_pixel
    if step < row_bytes:
        raise ConversionError(
            f"{msg.encoding} image {width}x{height}: step {step} is smaller than one row "
            f"({row_bytes} bytes)"
        )
    buf = np.frombuffer(msg.data, dtype=np.uint8)
    if buf.size != step * height:
        raise ConversionError(
            f"{msg.encoding} image {width}x{height} with step {step}: expected "
            f"{step * height} data bytes, got {buf.size}"
        )
    rows = buf.reshape(height, step)[:, :row_bytes]
    order: Literal["<", ">"] = ">" if msg.is_bigendian else "<"
    wire = spec.dtype.newbyteorder(order) if spec.dtype.itemsize > 1 else spec.dtype
    pixels = np.ascontiguousarray(rows).view(wire).astype(spec.dtype.newbyteorder("="))
    shape = (height, width, spec.channels) if spec.channels > 1 else (height, width)
    return pixels.reshape(shape)


def image_to_rgb(msg: ImageLike) -> np.ndarray:
    """rgb8 or bgr8 Image -> (H, W, 3) uint8 RGB."""
    if msg.encoding not in COLOR_ENCODINGS:
        raise ConversionError(
            f"expected a colour image ({' or '.join(COLOR_ENCODINGS)}), got {msg.encoding!r}"
        )
    pixels = image_to_numpy(msg)
    return np.ascontiguousarray(pixels[..., ::-1]) if msg.encoding == "bgr8" else pixels


def depth_to_meters(msg: ImageLike, *, invalid: float = 0.0) -> np.ndarray:
    """32FC1 (metres) or 16UC1 (millimetres) depth Image -> (H, W) float32 metres.

    Pixels without a valid return (NaN, +-Inf or <= 0 for 32FC1; 0 for 16UC1) become
    ``invalid`` (default 0, the fedepth frame convention).
    """
    if msg.encoding not in DEPTH_ENCODINGS:
        raise ConversionError(
            f"expected a depth image ({' or '.join(DEPTH_ENCODINGS)}), got {msg.encoding!r}"
        )
    raw = image_to_numpy(msg)
    if msg.encoding == "16UC1":
        meters = raw.astype(np.float32) / np.float32(1000.0)
        bad = raw == 0
    else:
        meters = raw.astype(np.float32, copy=False)
        bad = ~np.isfinite(meters) | (meters <= 0)
    meters[bad] = invalid
    return meters


# ---------------------------------------------------------------- numpy -> images


def image_fields(
    pixels: np.ndarray,
    encoding: str,
    *,
    step: int | None = None,
    is_bigendian: bool = False,
) -> dict[str, Any]:
    """Array -> Image fields ``height, width, encoding, is_bigendian, step, data`` (bytes).

    ``pixels`` is (H, W, 3) uint8 for rgb8/bgr8, (H, W) float for 32FC1 (cast to float32) and
    (H, W) uint16 for 16UC1. ``step`` defaults to the packed row size; a larger step pads each
    row with zero bytes.
    """
    spec = _spec(encoding)
    pixels = np.asarray(pixels)
    expected = "(H, W, 3)" if spec.channels > 1 else "(H, W)"
    if spec.channels > 1:
        ok_shape = pixels.ndim == 3 and pixels.shape[2] == spec.channels
    else:
        ok_shape = pixels.ndim == 2
    if not ok_shape:
        raise ConversionError(f"{encoding} needs an array of shape {expected}, got {pixels.shape}")
    if spec.dtype.kind == "f" and pixels.dtype.kind == "f":
        pixels = pixels.astype(spec.dtype, copy=False)
    elif pixels.dtype != spec.dtype:
        raise ConversionError(f"{encoding} needs dtype {spec.dtype}, got {pixels.dtype}")
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    row_bytes = width * spec.bytes_per_pixel
    step = row_bytes if step is None else int(step)
    if step < row_bytes:
        raise ConversionError(
            f"{encoding} image {width}x{height}: step {step} is smaller than one row "
            f"({row_bytes} bytes)"
        )
    wire = spec.dtype.newbyteorder(">" if is_bigendian else "<")
    packed = np.ascontiguousarray(pixels, dtype=wire).view(np.uint8).reshape(height, row_bytes)
    if step > row_bytes:
        padded = np.zeros((height, step), dtype=np.uint8)
        padded[:, :row_bytes] = packed
        packed = padded
    return {
        "height": height,
        "width": width,
        "encoding": encoding,
        "is_bigendian": int(bool(is_bigendian)),
        "step": step,
        "data": packed.tobytes(),
    }


def depth_image_fields(
    meters: np.ndarray, encoding: str = "32FC1", **kwargs: Any
) -> dict[str, Any]:
    """(H, W) metres with 0 / NaN / Inf = invalid -> REP 118 depth Image fields.

    32FC1 keeps metres and writes invalid pixels as NaN; 16UC1 writes rounded millimetres and
    invalid pixels (and depths beyond 65.535 m, which do not fit) as 0.
    """
    meters = np.asarray(meters)
    if meters.ndim != 2 or meters.dtype.kind != "f":
        raise ConversionError(
            f"depth must be a (H, W) float array in metres, got {meters.dtype} {meters.shape}"
        )
    bad = ~np.isfinite(meters) | (meters <= 0)
    if encoding == "32FC1":
        out: np.ndarray = np.where(bad, np.float32(np.nan), meters).astype(np.float32)
    elif encoding == "16UC1":
        mm = np.rint(np.where(bad, 0.0, meters.astype(np.float64) * 1000.0))
        mm[mm > np.iinfo(np.uint16).max] = 0
        out = mm.astype(np.uint16)
    else:
        raise ConversionError(
            f"depth encoding must be one of {', '.join(DEPTH_ENCODINGS)}, got {encoding!r}"
        )
    return image_fields(out, encoding, **kwargs)


# ---------------------------------------------------------------- camera info


def camera_info_fields(
    K: np.ndarray,
    width: int,
    height: int,
    *,
    distortion_model: str = "plumb_bob",
    D: np.ndarray | None = None,
) -> dict[str, Any]:
    """3x3 intrinsics -> CameraInfo fields (float64 arrays), for a rectified pinhole camera.

    ``k`` is K, ``r`` the identity, ``p`` = [K | 0] and ``d`` the given distortion (default
    five zeros for plumb_bob).
    """
    K = np.asarray(K, dtype=np.float64)
    if K.shape != (3, 3) or not np.isfinite(K).all():
        raise ConversionError(f"K must be a finite 3x3 matrix, got shape {K.shape}")
    if K[0, 0] <= 0 or K[1, 1] <= 0:
        raise ConversionError(f"K has non-positive focal lengths fx={K[0, 0]}, fy={K[1, 1]}")
    if int(width) <= 0 or int(height) <= 0:
        raise ConversionError(f"image size must be positive, got {width}x{height}")
    d = np.zeros(5) if D is None else np.asarray(D, dtype=np.float64).reshape(-1)
    P = np.zeros((3, 4))
    P[:, :3] = K
    return {
        "height": int(height),
        "width": int(width),
        "distortion_model": distortion_model,
        "d": d,
        "k": K.reshape(-1).copy(),
        "r": np.eye(3).reshape(-1),
        "p": P.reshape(-1),
    }


def k_from_camera_info(msg: CameraInfoLike) -> np.ndarray:
    """CameraInfo -> 3x3 float64 K; raises if K is unset (all zeros, an uncalibrated camera)."""
    k = np.asarray(msg.k, dtype=np.float64)
    if k.size != 9:
        raise ConversionError(f"CameraInfo.k must hold 9 values, got {k.size}")
    K = k.reshape(3, 3).copy()
    if not K.any():
        raise ConversionError("CameraInfo.k is all zeros (uncalibrated camera)")
    return K


# ---------------------------------------------------------------- point clouds


def depth_to_points(depth: np.ndarray, K: np.ndarray) -> np.ndarray:
    """(H, W) metres and 3x3 K -> (H, W, 3) float32 XYZ in the camera (optical) frame:
    X = (u - cx) Z / fx, Y = (v - cy) Z / fy; NaN where the depth is invalid (<= 0 or NaN)."""
    z = np.asarray(depth, dtype=np.float32)
    K = np.asarray(K, dtype=np.float64)
    h, w = z.shape
    u = np.arange(w, dtype=np.float32)[None, :]
    v = np.arange(h, dtype=np.float32)[:, None]
    z = np.where(np.isfinite(z) & (z > 0), z, np.float32(np.nan))
    x = (u - np.float32(K[0, 2])) * z / np.float32(K[0, 0])
    y = (v - np.float32(K[1, 2])) * z / np.float32(K[1, 1])
    return np.stack([x, y, z], axis=-1).astype(np.float32)
