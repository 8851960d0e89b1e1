"""M3ED reader: ``<seq>_data.h5`` + ``<seq>_depth_gt.h5`` as RGB-D frames in the RGB camera.

M3ED's depth ground truth is rendered from aggregated LiDAR scans into the LEFT EVENT camera
(``/depth/prophesee/left``: (N, H, W) float32 metres, +inf where no point landed, at the LiDAR's
~10 Hz with ``ts`` in microseconds). The RGB frames are ``/ovc/rgb/data`` (N, H, W, 3) uint8 in
BGR order at 25 Hz with ``/ovc/ts`` in microseconds. Every camera group has a Kalibr calibration
under ``<cam>/calib``: ``intrinsics = [fx, fy, cx, cy]``, ``distortion_model = radtan``,
``distortion_coeffs = [k1, k2, p1, p2]``, ``resolution = [w, h]`` and ``T_to_prophesee_left``,
the 4 x 4 transform of points from that camera's frame into the left event camera's frame.

A frame here is one depth sample: its depth is reprojected into the RGB camera (back-project with
the event camera's intrinsics and distortion, ``inv(T_rgb) @ T_event``, project with the RGB
intrinsics and distortion, nearest point per pixel), paired with the RGB image nearest in time,
converted BGR -> RGB. Files are opened on first use; frames are read one at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from fedepth.data import h5util
from fedepth.data.camera import Camera, invert_transform, reproject_depth
from fedepth.data.errors import DataError
from fedepth.data.sequence import Frame, Sequence, SequenceMeta
from fedepth.depth_range import for_environment

log = logging.getLogger(__name__)

RGB_GROUP = "/ovc/rgb"
RGB_TS = "/ovc/ts"
EVENT_CAMERA = "/prophesee/left"
#: Largest allowed gap between a depth sample and its nearest RGB frame: one frame at 25 Hz.
MAX_PAIR_GAP_US = 40_000


@dataclass(frozen=True)
class CameraCalibration:
    """A camera as Kalibr calibrated it, plus its pose in the left event camera's frame."""

    camera: Camera
    T_to_prophesee_left: npt.NDArray[np.float64]


def read_calibration(f: h5py.File, group: str) -> CameraCalibration:
    """Read and check ``<group>/calib`` of an M3ED data file."""
    base = f"{group}/calib"
    intr = h5util.read_array(f, f"{base}/intrinsics", (4,)).astype(np.float64)
    res = h5util.read_array(f, f"{base}/resolution", (2,))
    T = h5util.read_array(f, f"{base}/T_to_prophesee_left", (4, 4)).astype(np.float64)
    model = h5util.read_string(f, f"{base}/distortion_model").strip().lower()
    if model not in ("radtan", "plumb_bob"):
        raise DataError(
            f.filename,
            f"unsupported distortion model {model!r} (expected radtan)",
            key=f"{base}/distortion_model",
        )
    coeffs = h5util.read_array(f, f"{base}/distortion_coeffs", (4,)).astype(np.float64)
    if not (np.isfinite(intr).all() and np.isfinite(coeffs).all() and np.isfinite(T).all()):
        raise DataError(f.filename, "calibration contains NaN or Inf", key=base)
    if intr[0] <= 0 or intr[1] <= 0:
        raise DataError(f.filename, f"focal lengths must be > 0, got {intr[:2]}", key=base)
    if not np.allclose(T[3], [0, 0, 0, 1]) or not np.allclose(
        T[:3, :3] @ T[:3, :3].T, np.eye(3), atol=1e-4
    ):
        raise DataError(f.filename, "not a rigid transform", key=f"{base}/T_to_prophesee_left")
    w, h = (int(x) for x in res)
    k1, k2, p1, p2 = (float(c) for c in coeffs)
    cam = Camera(
        w, h, float(intr[0]), float(intr[1]), float(intr[2]), float(intr[3]), (k1, k2, p1, p2)
    )
    return CameraCalibration(cam, T)


def parse_m3ed_name(name: str) -> tuple[str, str]:
    """(platform, environment) from an M3ED sequence name such as ``car_urban_night_city_hall``.

    M3ED names start with the platform (car, falcon, spot) and then the environment
    (``forest``, ``indoor``, ``urban_day`` / ``outdoor_day``, ``urban_night`` / ``outdoor_night``).
    """
    parts = name.split("_")
    platform = parts[0] if parts else ""
    rest = "_".join(parts[1:])
    if rest.startswith(("urban_day", "outdoor_day")):
        env = "urban_day"
    elif rest.startswith(("urban_night", "outdoor_night")):
        env = "urban_night"
    elif rest.startswith("forest") or rest.startswith("into_forest"):
        env = "forest"
    elif rest.startswith("indoor"):
        env = "indoor"
    else:
        env = "unknown"
    return platform, env


def _sequence_name(data_path: Path) -> str:
    stem = data_path.stem
    return stem[: -len("_data")] if stem.endswith("_data") else stem


def _check_timestamps(f: h5py.File, key: str, n: int) -> npt.NDArray[np.int64]:
    ts = h5util.read_array(f, key, (-1,))
    if ts.shape[0] != n:
        raise DataError(f.filename, f"{ts.shape[0]} timestamps for {n} frames", key=key)
    if ts.size and not np.isfinite(ts.astype(np.float64)).all():
        raise DataError(f.filename, "timestamps contain NaN or Inf", key=key)
    ts64 = np.rint(ts.astype(np.float64)).astype(np.int64) if ts.dtype.kind == "f" else ts
    ts64 = ts64.astype(np.int64)
    if ts64.size > 1 and (np.diff(ts64) < 0).any():
        raise DataError(f.filename, "timestamps are not sorted", key=key)
    return ts64


def pair_nearest(
    depth_ts: npt.NDArray[np.int64], rgb_ts: npt.NDArray[np.int64], max_gap: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """For each depth time, the index of the RGB time nearest to it (ties: earlier frame).

    Returns (depth indices kept, their RGB indices); depth samples whose nearest RGB frame is
    more than ``max_gap`` away (before the camera started, after it stopped, dropped frames) are
    left out.
    """
    if rgb_ts.size == 0 or depth_ts.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    right = np.clip(np.searchsorted(rgb_ts, depth_ts), 0, rgb_ts.size - 1)
    left = np.clip(right - 1, 0, rgb_ts.size - 1)
    pick_left = np.abs(depth_ts - rgb_ts[left]) <= np.abs(rgb_ts[right] - depth_ts)
    nearest = np.where(pick_left, left, right)
    ok = np.abs(rgb_ts[nearest] - depth_ts) <= max_gap
    return np.flatnonzero(ok).astype(np.int64), nearest[ok].astype(np.int64)


class M3EDSequence(Sequence):
    """One M3ED sequence as RGB-D frames in the RGB camera (see the module docstring).

    ``depth_path=None`` reads a sequence without ground truth (M3ED's test files ship none):
    every RGB frame becomes a frame with an all-invalid depth map.
    """

    def __init__(
        self,
        data_path: str | Path,
        depth_path: str | Path | None = None,
        *,
        name: str | None = None,
        meta: SequenceMeta | None = None,
        split: str = "train",
        rgb_group: str = RGB_GROUP,
        depth_camera: str = EVENT_CAMERA,
        max_pair_gap_us: int = MAX_PAIR_GAP_US,
    ) -> None:
        self.data_path = Path(data_path)
        self.depth_path = Path(depth_path) if depth_path is not None else None
        seq_name = name or _sequence_name(self.data_path)
        if meta is None:
            platform, env = parse_m3ed_name(seq_name)
            caps = for_environment(env)  # indoor as NYUv2, outdoor as KITTI
            meta = SequenceMeta(platform, env, "m3ed", split, caps.min_depth, caps.max_depth)
        super().__init__(seq_name, meta)
        self.rgb_key = f"{rgb_group}/data"
        self.depth_key = f"/depth{depth_camera}"
        self._data: h5py.File | None = None
        self._depth: h5py.File | None = None
        self._rays: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None

        with h5util.open_h5(self.data_path) as f:
            self.rgb_calib = read_calibration(f, rgb_group)
            self.event_calib = read_calibration(f, depth_camera)
            rgb = h5util.dataset(f, self.rgb_key)
            if rgb.ndim != 4 or rgb.shape[3] != 3 or rgb.dtype != np.uint8:
                raise DataError(
                    f.filename,
                    f"expected (N, H, W, 3) uint8, found {rgb.shape} {rgb.dtype}",
                    key=self.rgb_key,
                )
            n_rgb, h, w = (int(x) for x in rgb.shape[:3])
            cam = self.rgb_calib.camera
            if (cam.width, cam.height) != (w, h):
                raise DataError(
                    f.filename,
                    f"images are {w}x{h} but {rgb_group}/calib/resolution says "
                    f"{cam.width}x{cam.height}",
                    key=self.rgb_key,
                )
            ts_key = RGB_TS if rgb_group.startswith("/ovc") else f"{rgb_group}/ts"
            self.rgb_ts = _check_timestamps(f, ts_key, n_rgb)

        # T_rgb_event: event-camera points -> RGB camera frame.
        self.T_rgb_event = (
            invert_transform(self.rgb_calib.T_to_prophesee_left)
            @ self.event_calib.T_to_prophesee_left
        )
        if self.depth_path is None:
            self.depth_index = np.full(n_rgb, -1, dtype=np.int64)
            self.rgb_index = np.arange(n_rgb, dtype=np.int64)
            self.depth_ts = self.rgb_ts.copy()
        else:
            with h5util.open_h5(self.depth_path) as g:
                dd = h5util.dataset(g, self.depth_key)
                ev = self.event_calib.camera
                if dd.ndim != 3 or tuple(dd.shape[1:]) != (ev.height, ev.width):
                    raise DataError(
                        g.filename,
                        f"depth maps {tuple(dd.shape)} do not match the event camera "
                        f"({ev.height}, {ev.width}) of {self.data_path.name}",
                        key=self.depth_key,
                    )
                self.depth_ts = _check_timestamps(g, "/ts", int(dd.shape[0]))
            self.depth_index, self.rgb_index = pair_nearest(
                self.depth_ts, self.rgb_ts, max_pair_gap_us
            )
            dropped = self.depth_ts.size - self.depth_index.size
            if dropped:
                log.info(
                    "%s: %d depth samples have no RGB frame within %d us",
                    seq_name,
                    dropped,
                    max_pair_gap_us,
                )
            if self.depth_index.size == 0:
                raise DataError(
                    self.depth_path,
                    f"none of {self.depth_ts.size} depth samples has an RGB frame within "
                    f"{max_pair_gap_us} us in {self.data_path.name}",
                    key="/ts",
                )

    def __len__(self) -> int:
        return int(self.rgb_index.size)

    def _files(self) -> tuple[h5py.File, h5py.File | None]:
        if self._data is None:
            self._data = h5util.open_h5(self.data_path)
        if self.depth_path is not None and self._depth is None:
            self._depth = h5util.open_h5(self.depth_path)
        return self._data, self._depth

    def _rgb(self, i: int) -> npt.NDArray[np.uint8]:
        data, _ = self._files()
        bgr = h5util.read(data, self.rgb_key, int(self.rgb_index[i]))
        return np.ascontiguousarray(bgr[..., ::-1])

    def raw_depth(self, i: int) -> npt.NDArray[np.float32]:
        """Frame ``i``'s depth as stored, in the event camera (+inf and NaN kept)."""
        _, depth = self._files()
        if depth is None:
            ev = self.event_calib.camera
            return np.full((ev.height, ev.width), np.inf, dtype=np.float32)
        return h5util.read(depth, self.depth_key, int(self.depth_index[self._index(i)])).astype(
            np.float32
        )

    def _frame(self, i: int) -> Frame:
        rgb = self._rgb(i)
        cam = self.rgb_calib.camera
        if self.depth_path is None:
            depth = np.zeros((cam.height, cam.width), dtype=np.float32)
        else:
            if self._rays is None:
                self._rays = self.event_calib.camera.pixel_rays()
            depth = reproject_depth(
                self.raw_depth(i), self.event_calib.camera, cam, self.T_rgb_event, self._rays
            )
        return Frame(rgb, depth, cam.matrix, int(self.rgb_ts[self.rgb_index[i]]) * 1000)

    def close(self) -> None:
        for f in (self._data, self._depth):
            if f is not None:
                f.close()
        self._data = None
        self._depth = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_data"] = None
        state["_depth"] = None
        return state
