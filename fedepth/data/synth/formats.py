"""Writers of the real dataset formats: M3ED h5 pairs, NYUv2 labeled .mat + splits.mat, KITTI.

Each writer streams frame by frame (nothing is held for a whole sequence) and writes exactly the
layout the readers in :mod:`fedepth.data` (and the datasets' own tools) expect. What the
synthetic files leave out is stated per writer.
"""

from __future__ import annotations

import struct
from pathlib import Path

import h5py
import numpy as np
import numpy.typing as npt
import scipy.io
from PIL import Image

from fedepth import __version__
from fedepth.data.camera import Camera
from fedepth.data.synth.platforms import Rig

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
VERSION = f"fedepth-synth {__version__}"


def _write_calib(group: h5py.Group, cam: Camera, T_to_prophesee_left: npt.ArrayLike) -> None:
    g = group.create_group("calib")
    g["camera_model"] = "pinhole"
    g["distortion_model"] = "radtan"
    g["distortion_coeffs"] = np.asarray(cam.dist, dtype=np.float64)
    g["intrinsics"] = cam.intrinsics
    g["resolution"] = np.asarray(cam.resolution, dtype=np.int64)
    g["T_to_prophesee_left"] = np.asarray(T_to_prophesee_left, dtype=np.float64)


class M3EDWriter:
    """Writes ``<name>_data.h5`` and ``<name>_depth_gt.h5`` in M3ED's layout.

    Data file: ``/ovc/rgb/data`` (N, H, W, 3) uint8 BGR, ``/ovc/ts`` int64 us, Kalibr calibration
    of ``/ovc/rgb`` and ``/prophesee/left``. Depth file: ``/depth/prophesee/left`` (M, h, w)
    float32 metres with +inf where nothing was measured, ``/ts`` int64 us, ``/Cn_T_C0`` camera
    poses relative to the first. Left out: event streams, the grayscale OVC imagers, IMU, LiDAR
    packets, ``Ln_T_L0`` and the event index maps (nothing here renders events or LiDAR scans).
    """

    def __init__(
        self,
        directory: str | Path,
        name: str,
        rig: Rig,
        rgb_ts: npt.ArrayLike,
        depth_ts: npt.ArrayLike | None,
        note: str,
    ) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.data_path = d / f"{name}_data.h5"
        self.depth_path = d / f"{name}_depth_gt.h5"
        rgb_ts = np.asarray(rgb_ts, dtype=np.int64)
        self._data = h5py.File(self.data_path, "w")
        self._data.attrs["version"] = VERSION
        self._data.attrs["raw_bag_name"] = f"{name}.bag"
        self._data.attrs["creation_date"] = note
        ovc = self._data.create_group("ovc")
        rgb = ovc.create_group("rgb")
        c = rig.rgb
        self._rgb = rgb.create_dataset(
            "data",
            (rgb_ts.size, c.height, c.width, 3),
            dtype="u1",
            chunks=(1, c.height, c.width, 3),
            compression="lzf",
        )
        ovc.create_dataset("ts", data=rgb_ts, dtype="i8")
        _write_calib(rgb, c, rig.T_event_rgb)
        _write_calib(self._data.create_group("prophesee/left"), rig.event, np.eye(4))
        self._depth_file: h5py.File | None = None
        if depth_ts is not None:
            dts = np.asarray(depth_ts, dtype=np.int64)
            e = rig.event
            self._depth_file = h5py.File(self.depth_path, "w")
            self._depth_file.attrs["version"] = VERSION
            self._depth_file.attrs["creation_date"] = note
            self._depth_file.attrs["cam_name"] = "/prophesee/left"
            self._depth_file.create_dataset("ts", data=dts, dtype="i8")
            self._poses = self._depth_file.create_dataset("Cn_T_C0", (dts.size, 4, 4), dtype="f8")
            self._depth = self._depth_file.create_dataset(
                "depth/prophesee/left",
                (dts.size, e.height, e.width),
                dtype="f4",
                chunks=(1, e.height, e.width),
                compression="lzf",
            )
        self._T0: npt.NDArray[np.float64] | None = None

    def write_rgb(self, i: int, rgb: U8) -> None:
        """Frame i, given in RGB order (stored BGR, as cv_bridge wrote M3ED's images)."""
        self._rgb[i] = rgb[..., ::-1]

    def write_depth(self, j: int, depth: F32, T_world_event: npt.NDArray[np.float64]) -> None:
        """Depth sample j in the event camera (0 = no measurement, stored as +inf)."""
        if self._depth_file is None:
            raise RuntimeError("this sequence was opened without depth")
        self._depth[j] = np.where(depth > 0, depth, np.inf).astype(np.float32)
        if self._T0 is None:
            self._T0 = np.array(T_world_event, dtype=np.float64)
        # Cn_T_C0 maps points from camera 0's frame into camera n's frame.
        self._poses[j] = np.linalg.inv(T_world_event) @ self._T0

    def close(self) -> None:
        self._data.close()
        if self._depth_file is not None:
            self._depth_file.close()


def _matlab_header() -> bytes:
    """The 128-byte header MATLAB puts in a v7.3 file's HDF5 user block."""
    text = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created by: fedepth synth HDF5 schema 1.00 ."
    return text.ljust(116, b" ") + b"\x00" * 8 + struct.pack("<H", 0x0200) + b"IM"


class NYUWriter:
    """Writes a labeled-NYUv2-style ``.mat`` (MATLAB v7.3 = HDF5 with a 512-byte user block).

    Through h5py ``images`` is (N, 3, W, H) uint8 and ``depths`` (N, W, H) float32 metres (MATLAB's
    column-major H x W x 3 x N and H x W x N), ``scenes`` and ``sceneTypes`` are N x 1 cell
    arrays of strings (object references to uint16 char arrays under ``#refs#``). Left out:
    ``rawDepths``, ``labels``, ``instances``, ``names`` and the accelerometer data.
    """

    def __init__(self, path: str | Path, num_images: int, height: int, width: int) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = h5py.File(self.path, "w", userblock_size=512)
        self._images = self._f.create_dataset(
            "images",
            (num_images, 3, width, height),
            dtype="u1",
            chunks=(1, 3, width, height),
            compression="gzip",
        )
        self._images.attrs["MATLAB_class"] = np.bytes_("uint8")
        self._depths = self._f.create_dataset(
            "depths",
            (num_images, width, height),
            dtype="f4",
            chunks=(1, width, height),
            compression="gzip",
        )
        self._depths.attrs["MATLAB_class"] = np.bytes_("single")
        self.scenes = [""] * num_images
        self.scene_types = [""] * num_images

    def write(self, i: int, rgb: U8, depth: F32, scene: str, scene_type: str) -> None:
        self._images[i] = rgb.transpose(2, 1, 0)
        self._depths[i] = depth.T
        self.scenes[i] = scene
        self.scene_types[i] = scene_type

    def _cellstr(self, key: str, values: list[str]) -> None:
        refs_group = self._f.require_group("#refs#")
        refs = []
        for k, v in enumerate(values):
            chars = np.array([[ord(c)] for c in v] or [[0]], dtype=np.uint16).T
            ds = refs_group.create_dataset(f"{key}_{k}", data=chars)
            ds.attrs["MATLAB_class"] = np.bytes_("char")
            ds.attrs["MATLAB_int_decode"] = np.int32(2)
            refs.append(ds.ref)
        cell = self._f.create_dataset(key, (1, len(values)), dtype=h5py.ref_dtype)
        cell[0, :] = refs
        cell.attrs["MATLAB_class"] = np.bytes_("cell")

    def close(self) -> None:
        self._cellstr("scenes", self.scenes)
        self._cellstr("sceneTypes", self.scene_types)
        self._f.close()
        with open(self.path, "r+b") as fh:
            fh.write(_matlab_header())


def write_nyu_splits(path: str | Path, train: npt.ArrayLike, test: npt.ArrayLike) -> None:
    """``splits.mat`` (MATLAB v5) with 1-based column vectors ``trainNdxs`` and ``testNdxs``."""
    tr = np.asarray(train, dtype=np.float64).reshape(-1, 1) + 1
    te = np.asarray(test, dtype=np.float64).reshape(-1, 1) + 1
    scipy.io.savemat(str(path), {"trainNdxs": tr, "testNdxs": te}, format="5")


def write_kitti_rgb(path: Path, rgb: U8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path)


def write_kitti_depth(path: Path, depth: F32) -> None:
    """uint16 PNG, value = round(metres * 256), 0 = no LiDAR point."""
    path.parent.mkdir(parents=True, exist_ok=True)
    v = np.clip(np.rint(depth.astype(np.float64) * 256.0), 0, 65535).astype(np.uint16)
    Image.fromarray(v).save(path)


def write_kitti_calib(path: Path, cam: Camera) -> None:
    """``calib_cam_to_cam.txt`` with camera 2's rectified projection ``P_rect_02``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    P = np.array([[cam.fx, 0, cam.cx, 0.0], [0, cam.fy, cam.cy, 0.0], [0, 0, 1, 0.0]])
    rows = [
        f"calib_time: synthetic ({VERSION})",
        f"S_rect_02: {cam.width:e} {cam.height:e}",
        "P_rect_02: " + " ".join(f"{x:e}" for x in P.ravel()),
    ]
    path.write_text("\n".join(rows) + "\n")
