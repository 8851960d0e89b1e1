"""numpy arrays -> rclpy messages (sensor_msgs Image, CameraInfo, PointCloud2; stamps).

The ROS half of the conversions: the fields come from :mod:`fedepth.data.rosmsg` (no ROS, also
used by the bag writer), the message packages are imported here, lazily, so that importing this
module needs no ROS installation.
"""

from __future__ import annotations

import array
from typing import TYPE_CHECKING, Any

import numpy as np

from fedepth.data.rosmsg import (
    camera_info_fields,
    depth_image_fields,
    image_fields,
    split_ns,
)

if TYPE_CHECKING:
    from builtin_interfaces.msg import Time
    from sensor_msgs.msg import CameraInfo, Image


def ns_to_stamp(stamp_ns: int) -> Time:
    """Integer nanoseconds -> builtin_interfaces.msg.Time (rclpy message)."""
    from builtin_interfaces.msg import Time

    sec, nanosec = split_ns(stamp_ns)
    return Time(sec=sec, nanosec=nanosec)


def _header(stamp_ns: int, frame_id: str) -> Any:
    from std_msgs.msg import Header

    return Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id)


def _image_msg(fields: dict[str, Any], stamp_ns: int, frame_id: str) -> Image:
    from sensor_msgs.msg import Image

    data = array.array("B")
    data.frombytes(fields.pop("data"))
    msg = Image(header=_header(stamp_ns, frame_id), **fields)
    msg.data = data  # array.array('B') is the setter's fast path
    return msg


def numpy_to_image(
    pixels: np.ndarray,
    encoding: str,
    *,
    stamp_ns: int = 0,
    frame_id: str = "",
    step: int | None = None,
    is_bigendian: bool = False,
) -> Image:
    """Array -> sensor_msgs.msg.Image (see :func:`image_fields` for shapes and dtypes)."""
    fields = image_fields(pixels, encoding, step=step, is_bigendian=is_bigendian)
    return _image_msg(fields, stamp_ns, frame_id)


def meters_to_depth_image(
    meters: np.ndarray,
    encoding: str = "32FC1",
    *,
    stamp_ns: int = 0,
    frame_id: str = "",
    step: int | None = None,
    is_bigendian: bool = False,
) -> Image:
    """(H, W) metres -> REP 118 depth sensor_msgs.msg.Image (see :func:`depth_image_fields`)."""
    fields = depth_image_fields(meters, encoding, step=step, is_bigendian=is_bigendian)
    return _image_msg(fields, stamp_ns, frame_id)


def camera_info_from_k(
    K: np.ndarray,
    width: int,
    height: int,
    *,
    stamp_ns: int = 0,
    frame_id: str = "",
    distortion_model: str = "plumb_bob",
    D: np.ndarray | None = None,
) -> CameraInfo:
    """3x3 intrinsics and image size -> sensor_msgs.msg.CameraInfo."""
    from sensor_msgs.msg import CameraInfo

    fields = camera_info_fields(K, width, height, distortion_model=distortion_model, D=D)
    return CameraInfo(header=_header(stamp_ns, frame_id), **fields)


def restamped_camera_info(info: CameraInfo, header: Any) -> CameraInfo:
    """A copy of the camera model ``info`` with another ``header`` (an output image's)."""
    from sensor_msgs.msg import CameraInfo

    out = CameraInfo()
    for name in CameraInfo.get_fields_and_field_types():
        setattr(out, name, getattr(info, name))
    out.header = header
    return out


def points_message(points: np.ndarray, *, header: Any) -> Any:
    """(H, W, 3) float32 XYZ -> an organized sensor_msgs/PointCloud2 (fields x, y, z)."""
    from sensor_msgs.msg import PointCloud2, PointField

    h, w, _ = points.shape
    fields = [
        PointField(name=n, offset=4 * i, datatype=PointField.FLOAT32, count=1)
        for i, n in enumerate("xyz")
    ]
    data = np.ascontiguousarray(points, dtype="<f4").tobytes()
    return PointCloud2(
        header=header,
        height=h,
        width=w,
        fields=fields,
        is_bigendian=False,
        point_step=12,
        row_step=12 * w,
        data=array.array("B", data),
        is_dense=False,
    )
