"""Write RGB-D frame sequences as rosbag2 bags (mcap or sqlite3) without ROS, via rosbags.

Each frame becomes three messages with the same header (stamp = the frame's ``stamp_ns``,
``frame_id`` as given) and the same bag log time:

- ``/image``: ``sensor_msgs/msg/Image`` rgb8;
- ``/depth``: ``sensor_msgs/msg/Image`` 32FC1 in metres, invalid pixels as NaN (REP 118: NaN
  is "no return" for floating point depth; the input convention 0 = invalid is translated), or
  16UC1 millimetres with 0 = invalid when asked;
- ``/camera_info``: ``sensor_msgs/msg/CameraInfo`` with K, R = I, P = [K | 0], plumb_bob with
  zero distortion (the frames are rectified).

Topic names are absolute in the bag, as ``ros2 bag record`` stores them; ``bag_player`` plays
them relative to its namespace by default.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from tqdm import tqdm

from fedepth.data.frames import FrameLike, RGBDFrame
from fedepth.data.rosmsg import (
    DEPTH_ENCODINGS,
    ConversionError,
    camera_info_fields,
    depth_image_fields,
    image_fields,
    split_ns,
)

STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
ROSBAG2_VERSION: Literal[9] = 9  # the metadata version written by Jazzy / Kilted
IMAGE = "sensor_msgs/msg/Image"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"


class BagWriteError(ValueError):
    """Frames or options that cannot be written; the message names the frame index."""


@dataclass(frozen=True, slots=True)
class BagTopics:
    """Topic names written to the bag."""

    image: str = "/image"
    depth: str = "/depth"
    camera_info: str = "/camera_info"


@dataclass(frozen=True, slots=True)
class WriteSummary:
    """What was written: the bag path, storage, frame count and stamp range."""

    path: Path
    storage: str
    frames: int
    start_ns: int
    end_ns: int


def _check_frame(i: int, frame: FrameLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    rgb = np.asarray(frame.rgb)
    depth = np.asarray(frame.depth)
    K = np.asarray(frame.K)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise BagWriteError(f"frame {i}: rgb must be (H, W, 3) uint8, got {rgb.dtype} {rgb.shape}")
    if depth.shape != rgb.shape[:2] or depth.dtype.kind != "f":
        raise BagWriteError(
            f"frame {i}: depth must be (H, W) float metres matching rgb {rgb.shape[:2]}, "
            f"got {depth.dtype} {depth.shape}"
        )
    if K.shape != (3, 3):
        raise BagWriteError(f"frame {i}: K must be 3x3, got {K.shape}")
    return rgb, depth, K, int(frame.stamp_ns)


def write_rgbd_bag(
    frames: Iterable[FrameLike],
    out: str | Path,
    *,
    storage: str = "mcap",
    frame_id: str = "camera",
    topics: BagTopics = BagTopics(),
    depth_encoding: str = "32FC1",
    custom_data: Mapping[str, str] | None = None,
    progress: bool = True,
    total: int | None = None,
    description: str = "bag",
) -> WriteSummary:
    """Write ``frames`` (objects with rgb, depth, K, stamp_ns) to a new rosbag2 at ``out``.

    ``out`` must not exist. Stamps must strictly increase. ``custom_data`` goes to the bag's
    metadata.yaml. A tqdm bar shows progress (``total`` defaults to ``len(frames)`` when
    known). On any error the partial bag is removed and the error re-raised.
    """
    out = Path(out)
    if storage not in STORAGES:
        raise BagWriteError(f"storage must be one of {', '.join(STORAGES)}, got {storage!r}")
    if depth_encoding not in DEPTH_ENCODINGS:
        raise BagWriteError(
            f"depth encoding must be one of {', '.join(DEPTH_ENCODINGS)}, got {depth_encoding!r}"
        )
    if out.exists():
        raise BagWriteError(f"{out} exists already; not overwriting")
    if total is None and isinstance(frames, Sized):
        total = len(frames)

    typestore = get_typestore(Stores.ROS2_KILTED)
    Image = typestore.types[IMAGE]
    CameraInfo = typestore.types[CAMERA_INFO]
    Header = typestore.types["std_msgs/msg/Header"]
    Time = typestore.types["builtin_interfaces/msg/Time"]
    Roi = typestore.types["sensor_msgs/msg/RegionOfInterest"]

    def image_msg(fields: dict[str, Any], header: Any) -> Any:
        data = np.frombuffer(fields.pop("data"), dtype=np.uint8)
        return Image(header=header, data=data, **fields)

    writer = Writer(out, version=ROSBAG2_VERSION, storage_plugin=STORAGES[storage])
    count, first, last = 0, 0, -1
    try:
        for key, value in (custom_data or {}).items():
            writer.set_custom_data(key, value)
        writer.open()
        conn_image = writer.add_connection(topics.image, IMAGE, typestore=typestore)
        conn_depth = writer.add_connection(topics.depth, IMAGE, typestore=typestore)
        conn_info = writer.add_connection(topics.camera_info, CAMERA_INFO, typestore=typestore)
        bar = tqdm(frames, total=total, desc=description, unit="frame", disable=not progress)
        for i, frame in enumerate(bar):
            rgb, depth, K, stamp = _check_frame(i, frame)
            if stamp <= last:
                raise BagWriteError(
                    f"frame {i}: stamp {stamp} ns does not increase (previous {last} ns)"
                )
            height, width = rgb.shape[:2]
            try:
                sec, nanosec = split_ns(stamp)
                info_fields = camera_info_fields(K, width, height)
                rgb_fields = image_fields(rgb, "rgb8")
                depth_fields = depth_image_fields(depth, depth_encoding)
            except ConversionError as exc:
                raise BagWriteError(f"frame {i}: {exc}") from None
            header = Header(stamp=Time(sec=sec, nanosec=nanosec), frame_id=frame_id)
            info = CameraInfo(
                header=header,
                binning_x=0,
                binning_y=0,
                roi=Roi(x_offset=0, y_offset=0, height=0, width=0, do_rectify=False),
                **info_fields,
            )
            rgb_msg = image_msg(rgb_fields, header)
            depth_msg = image_msg(depth_fields, header)
            writer.write(conn_info, stamp, typestore.serialize_cdr(info, CAMERA_INFO))
            writer.write(conn_image, stamp, typestore.serialize_cdr(rgb_msg, IMAGE))
            writer.write(conn_depth, stamp, typestore.serialize_cdr(depth_msg, IMAGE))
            if count == 0:
                first = stamp
            count, last = count + 1, stamp
        bar.close()
        if count == 0:
            raise BagWriteError("no frames to write (empty sequence)")
        writer.close()
    except BaseException:
        if writer.storage is not None:
            writer.close()
        shutil.rmtree(out, ignore_errors=True)
        raise
    return WriteSummary(out, storage, count, first, last)


def synthetic_frames(
    n: int,
    *,
    width: int = 64,
    height: int = 48,
    rate_hz: float = 10.0,
    start_ns: int = 1_700_000_000_000_000_000,
    seed: int = 0,
) -> list[RGBDFrame]:
    """A small moving RGB-D scene (a tilted plane with a box) for tests and smoke runs.

    Depth lies in [1, 6] m with a band of invalid (0) pixels at the top rows, like a sensor
    without return on the sky; the rgb is shaded by depth plus noise.
    """
    if n < 1 or width < 4 or height < 4 or rate_hz <= 0:
        raise ValueError(f"need n >= 1, size >= 4x4 and rate > 0, got {n}, {width}x{height}")
    rng = np.random.default_rng(seed)
    fx = fy = 0.8 * width
    K = np.array([[fx, 0.0, (width - 1) / 2], [0.0, fy, (height - 1) / 2], [0.0, 0.0, 1.0]])
    v, u = np.mgrid[0:height, 0:width].astype(np.float32)
    period_ns = round(1e9 / rate_hz)
    frames = []
    for i in range(n):
        depth = 1.0 + 5.0 * (v / (height - 1)) ** 1.5 + 0.1 * np.sin(0.3 * u + 0.2 * i)
        x0 = int((i * 2) % max(1, width - width // 4))
        depth[height // 3 : 2 * height // 3, x0 : x0 + width // 4] = 1.5
        depth[: max(1, height // 8)] = 0.0
        depth = depth.astype(np.float32)
        shade = np.clip(255.0 * (1.0 - depth / 7.0), 0, 255)
        shade[depth == 0] = 200.0
        rgb = np.stack([shade, 0.8 * shade, 0.6 * shade + 40.0 * (u / width)], axis=-1)
        rgb = np.clip(rgb + rng.normal(0.0, 3.0, rgb.shape), 0, 255).astype(np.uint8)
        frames.append(RGBDFrame(rgb=rgb, depth=depth, K=K, stamp_ns=start_ns + i * period_ns))
    return frames
