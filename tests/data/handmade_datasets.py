"""Hand-made tiny dataset files in the real layouts, written into tmp_path (nothing downloaded)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.io
from PIL import Image

EVENT = {"w": 16, "h": 12, "K": (14.0, 14.0, 7.5, 5.5), "D": (0.0, 0.0, 0.0, 0.0)}
RGB = {"w": 20, "h": 15, "K": (16.0, 16.0, 9.5, 7.0), "D": (0.0, 0.0, 0.0, 0.0)}


def _calib(g: h5py.Group, cam: dict[str, Any], T: np.ndarray) -> None:
    c = g.create_group("calib")
    c["camera_model"] = "pinhole"
    c["distortion_model"] = "radtan"
    c["distortion_coeffs"] = np.asarray(cam["D"], dtype=np.float64)
    c["intrinsics"] = np.asarray(cam["K"], dtype=np.float64)
    c["resolution"] = np.asarray([cam["w"], cam["h"]])
    c["T_to_prophesee_left"] = T


def rgb_pattern(i: int, h: int, w: int) -> np.ndarray:
    """An RGB image whose three channels differ (so a BGR/RGB swap shows) and encode i."""
    img = np.zeros((h, w, 3), dtype=np.uint8)
    img[..., 0] = 200
    img[..., 1] = 10 * i
    img[..., 2] = 30
    return img


def write_m3ed_pair(
    root: Path,
    *,
    name: str = "spot_forest_easy_1",
    rgb_ts: tuple[int, ...] = (0, 40_000, 80_000, 120_000, 160_000, 200_000),
    depth_ts: tuple[int, ...] = (15_000, 115_000, 190_000),
    plane: float = 5.0,
    T_rgb: np.ndarray | None = None,
    mutate: Callable[[h5py.File, h5py.File], None] | None = None,
) -> tuple[Path, Path]:
    """An M3ED-layout pair: the event camera sees a fronto-parallel plane at ``plane`` metres
    (one pixel column +inf); RGB frame i is :func:`rgb_pattern` (i) stored in BGR order."""
    data = root / f"{name}_data.h5"
    depth = root / f"{name}_depth_gt.h5"
    T = np.eye(4) if T_rgb is None else T_rgb
    with h5py.File(data, "w") as f, h5py.File(depth, "w") as g:
        n = len(rgb_ts)
        imgs = np.stack([rgb_pattern(i, RGB["h"], RGB["w"])[..., ::-1] for i in range(n)])
        f.create_dataset("/ovc/rgb/data", data=imgs, chunks=(1, RGB["h"], RGB["w"], 3))
        f["/ovc/ts"] = np.asarray(rgb_ts, dtype=np.int64)
        _calib(f["/ovc/rgb"], RGB, T)
        _calib(f.create_group("/prophesee/left"), EVENT, np.eye(4))
        d = np.full((len(depth_ts), EVENT["h"], EVENT["w"]), plane, dtype=np.float32)
        d[:, :, 0] = np.inf
        g.create_dataset("/depth/prophesee/left", data=d, chunks=(1, EVENT["h"], EVENT["w"]))
        g["/ts"] = np.asarray(depth_ts, dtype=np.float64)
        if mutate is not None:
            mutate(f, g)
    return data, depth


NYU_H, NYU_W, NYU_N = 6, 8, 5


def nyu_image(i: int) -> np.ndarray:
    """(H, W, 3) uint8 with distinct rows, columns and channels."""
    y, x = np.mgrid[0:NYU_H, 0:NYU_W]
    return np.stack([y * 10 + i, x * 10 + i, np.full_like(x, 200 - i)], -1).astype(np.uint8)


def nyu_depth(i: int) -> np.ndarray:
    y, x = np.mgrid[0:NYU_H, 0:NYU_W]
    return (1.0 + 0.1 * y + 0.01 * x + i).astype(np.float32)


def write_nyu(
    root: Path,
    *,
    drop: str | None = None,
    depth_shape: tuple[int, ...] | None = None,
    train: tuple[int, ...] = (1, 2, 4),
    test: tuple[int, ...] = (3, 5),
) -> tuple[Path, Path]:
    """A labeled-NYUv2-style .mat (HDF5, MATLAB axis order) and splits.mat (1-based)."""
    mat = root / "nyu_depth_v2_labeled.mat"
    with h5py.File(mat, "w") as f:
        if drop != "images":
            f["images"] = np.stack([nyu_image(i).transpose(2, 1, 0) for i in range(NYU_N)])
        if drop != "depths":
            d = np.stack([nyu_depth(i).T for i in range(NYU_N)])
            f["depths"] = d if depth_shape is None else np.zeros(depth_shape, np.float32)
    splits = root / "splits.mat"
    scipy.io.savemat(
        splits,
        {
            "trainNdxs": np.asarray(train, float)[:, None],
            "testNdxs": np.asarray(test, float)[:, None],
        },
    )
    return mat, splits


def write_kitti(
    root: Path,
    *,
    lines: list[str] | None = None,
    calib: bool = True,
    depth_size: tuple[int, int] = (5, 12),
) -> tuple[Path, Path, Path]:
    """A KITTI tree with one drive of three frames; frame 2 has no annotation (None)."""
    data, gt = root / "raw", root / "gt"
    drive = "2011_09_26_drive_0001_sync"
    if calib:
        (data / "2011_09_26").mkdir(parents=True)
        (data / "2011_09_26" / "calib_cam_to_cam.txt").write_text(
            "calib_time: x\nP_rect_02: 7.0 0 5.25 44.8 0 7.0 2.1 0.2 0 0 1 0.003\n"
        )
    default = []
    for k in range(3):
        rgb_rel = f"2011_09_26/{drive}/image_02/data/{k:010d}.png"
        (data / rgb_rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((5, 12, 3), 40 * k, np.uint8)).save(data / rgb_rel)
        gt_rel = "None"
        if k != 2:
            gt_rel = f"{drive}/proj_depth/groundtruth/image_02/{k:010d}.png"
            (gt / gt_rel).parent.mkdir(parents=True, exist_ok=True)
            v = np.zeros(depth_size, np.uint16)
            v[1, 2] = 256 * 10 + 128  # 10.5 m
            v[3, 4] = 65535  # 255.99609375 m, the largest value
            Image.fromarray(v).save(gt / gt_rel)
        default.append(f"{rgb_rel} {gt_rel} 7.0")
    split = root / "eigen_train_files_with_gt.txt"
    split.write_text("\n".join(lines if lines is not None else default) + "\n")
    return split, data, gt
