"""The BMR scenario's NYUv2-like rooms and KITTI-like drives, written in their datasets' formats.

:func:`generate_nyu` writes ``DIR/nyu`` (labeled .mat + splits.mat), :func:`generate_kitti`
``DIR/kitti`` (raw + annotated-depth trees and Eigen-style split files); both return the
manifest entries of what they wrote (:mod:`fedepth.data.synth.generate` drives them).
"""

from __future__ import annotations

import dataclasses
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from fedepth import depth_range
from fedepth.data.camera import Camera
from fedepth.data.synth import environments
from fedepth.data.synth.clearance import LIDAR_RANGE, clear_trajectory
from fedepth.data.synth.formats import (
    NYUWriter,
    write_kitti_calib,
    write_kitti_depth,
    write_kitti_rgb,
    write_nyu_splits,
)
from fedepth.data.synth.parallel import run_tasks
from fedepth.data.synth.platforms import (
    KITTI_CAMERA_HEIGHT,
    KITTI_DATES,
    KITTI_LIDAR_FOV_DEG,
    KITTI_LIDAR_HEIGHT,
    NYU_CAM,
    PLATFORMS,
)
from fedepth.data.synth.render import Renderer, day_lighting, indoor_lighting
from fedepth.data.synth.scenarios import (
    KITTI_STYLES,
    NYU_CLIENT_TYPES,
    NYU_TEST_TYPES,
    DataSizes,
    stable_seed,
)

F64 = npt.NDArray[np.float64]

#: KITTI's annotated depth is semi-dense: fraction of pixels inside the LiDAR's field of view
#: that keep a value (an order-of-magnitude assumption, not a measured figure), and frames at
#: each end of a drive that have no annotation (the accumulation window needs neighbours).
KITTI_DENSITY = 0.3
KITTI_UNANNOTATED_ENDS = 5


@dataclass(frozen=True)
class _Scene:
    name: str
    room_type: str
    split: str
    client: str | None
    images: int


def _nyu_scenes(profile: DataSizes, seed: int) -> list[_Scene]:
    """Scenes (rooms) with 1-6 images each (the labeled set averages ~3 per scene), assigned to
    the 15 clients or the test split, in a shuffled order as NYUv2 interleaves them."""
    rng = np.random.default_rng(stable_seed(seed, "nyu-scenes"))
    types = NYU_CLIENT_TYPES[: profile.nyu_clients]
    per_client = np.full(len(types), profile.nyu_train // len(types))
    per_client[: profile.nyu_train % len(types)] += 1
    scenes = []
    counter: dict[str, int] = {}

    def add(room: str, split: str, client: str | None, total: int) -> None:
        left = int(total)
        while left > 0:
            k = min(left, int(rng.integers(1, 7)))
            counter[room] = counter.get(room, 0) + 1
            scenes.append(_Scene(f"{room}_{counter[room]:04d}", room, split, client, k))
            left -= k

    for c, (room, n) in enumerate(zip(types, per_client, strict=True)):
        add(room, "train", f"nyu_{c:02d}_{room}", n)
    test_types = NYU_TEST_TYPES if profile.nyu_test >= len(NYU_TEST_TYPES) else types[:1]
    per_test = np.full(len(test_types), profile.nyu_test // len(test_types))
    per_test[: profile.nyu_test % len(test_types)] += 1
    for room, n in zip(test_types, per_test, strict=True):
        add(room, "test", None, n)
    order = rng.permutation(len(scenes))
    return [scenes[i] for i in order]


def generate_nyu(out: Path, profile: DataSizes, seed: int, progress: tqdm) -> list[dict[str, Any]]:
    scenes = _nyu_scenes(profile, seed)
    h, w = profile.nyu_size
    cam = NYU_CAM.resized(w, h)
    total = sum(s.images for s in scenes)
    mat = out / "nyu" / "nyu_depth_v2_labeled.mat"
    splits = out / "nyu" / "splits.mat"
    index: dict[str, list[int]] = {}
    train_idx: list[int] = []
    test_idx: list[int] = []
    handheld = PLATFORMS["handheld"]
    with closing(NYUWriter(mat, total, h, w)) as writer:
        i = 0
        for sc in scenes:
            rng = np.random.default_rng(stable_seed(seed, "nyu", sc.name))
            world = environments.indoor(rng, sc.room_type, handheld.height - 0.1)
            traj = clear_trajectory(
                world, handheld, "indoor", rng, 60.0, cam, np.arange(0.0, 60.0, 0.5), sc.name
            )
            lighting = indoor_lighting(rng)
            renderer = Renderer(world)
            for t in np.sort(rng.uniform(0.0, 60.0, sc.images)):
                img, depth = renderer.render(cam, traj.pose(float(t)), lighting=lighting, rng=rng)
                assert img is not None
                writer.write(i, img, depth, sc.name, sc.room_type)
                key = sc.client or f"nyu_test_{sc.room_type}"
                index.setdefault(key, []).append(i)
                (train_idx if sc.split == "train" else test_idx).append(i)
                i += 1
                progress.update()
    write_nyu_splits(splits, train_idx, test_idx)
    entries = []
    for key, idx in sorted(index.items()):
        split = "test" if key.startswith("nyu_test") else "train"
        entries.append(
            {
                "name": key,
                "split": split,
                "client": key if split == "train" else None,
                "platform": "handheld",
                "environment": "indoor",
                "source": "nyu",
                "site": key,
                "min_depth": depth_range.INDOOR.min_depth,
                "max_depth": depth_range.INDOOR.max_depth,
                "num_samples": len(idx),
                "files": {
                    "mat": mat.relative_to(out).as_posix(),
                    "splits": splits.relative_to(out).as_posix(),
                },
                "indices": idx,
            }
        )
    return entries


@dataclass(frozen=True)
class _KittiDriveSpec:
    """One synthetic KITTI drive to render: its directory name, date (camera), scene style,
    split and number of frames."""

    name: str
    date: str
    style: str
    split: str
    frames: int


def kitti_drives(profile: DataSizes, seed: int) -> list[_KittiDriveSpec]:
    rng = np.random.default_rng(stable_seed(seed, "kitti-drives"))
    dates = list(KITTI_DATES)
    drives = []
    lo, hi = profile.train_samples
    for k in range(profile.kitti_clients + profile.kitti_test_drives):
        split = "train" if k < profile.kitti_clients else "test"
        date = dates[k % len(dates)]
        style = KITTI_STYLES[int(rng.integers(len(KITTI_STYLES)))]
        n = (
            round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))))
            if split == "train"
            else profile.test_samples
        )
        drives.append(
            _KittiDriveSpec(
                f"{date}_drive_{k + 1:04d}_sync",
                date,
                style,
                split,
                n + 2 * KITTI_UNANNOTATED_ENDS,
            )
        )
    return drives


def _kitti_camera(date: str, scale: float) -> Camera:
    w, h, f, cx, cy = KITTI_DATES[date]
    return Camera(w, h, f, f, cx, cy).resized(max(8, round(w * scale)), max(4, round(h * scale)))


def _lidar_mask(
    depth: npt.NDArray[np.float32], cam: Camera, T: F64, rng: np.random.Generator
) -> npt.NDArray[np.float32]:
    """KITTI-like annotation: keep points inside the HDL-64E's vertical field of view (seen from
    the LiDAR 8 cm above the cameras) and a ``KITTI_DENSITY`` fraction of them."""
    x, y = cam.pixel_rays()
    pts = np.stack([x * depth, y * depth, depth], -1) @ T[:3, :3].T + T[:3, 3]
    lidar = T[:3, 3] + [0.0, 0.0, KITTI_LIDAR_HEIGHT - KITTI_CAMERA_HEIGHT]
    v = pts - lidar
    elev = np.degrees(np.arctan2(v[..., 2], np.hypot(v[..., 0], v[..., 1])))
    top, bottom = KITTI_LIDAR_FOV_DEG
    keep = (elev <= top) & (elev >= bottom) & (rng.random(depth.shape) < KITTI_DENSITY)
    return np.where(keep & (depth > 0), depth, 0.0).astype(np.float32)


_KittiDriveTask = tuple[_KittiDriveSpec, Path, int, DataSizes]


def _render_drive(task: _KittiDriveTask, progress: tqdm | None = None) -> list[str]:
    """Render one drive into the raw and annotated trees; returns its split-file lines."""
    d, root, seed, profile = task
    data_path, gt_path = root / "raw", root / "gt"
    car = dataclasses.replace(PLATFORMS["car"], height=KITTI_CAMERA_HEIGHT, pitch=(0.0, 1.0))
    rng = np.random.default_rng(stable_seed(seed, "kitti", d.name))
    cam = _kitti_camera(d.date, profile.kitti_scale)
    duration = d.frames / 10.0
    length = car.speed_range("urban_day")[1] * duration * 1.2 + 2 * environments.URBAN_MARGIN
    world = environments.urban(rng, d.style, length + 40.0)
    traj = clear_trajectory(
        world, car, "urban_day", rng, duration, cam, np.arange(d.frames) / 10.0, d.name
    )
    lighting = day_lighting(rng)
    renderer = Renderer(world)
    lines = []
    for k in range(d.frames):
        T = traj.pose(k / 10.0)
        img, depth = renderer.render(cam, T, lighting=lighting, max_range=LIDAR_RANGE, rng=rng)
        assert img is not None
        rgb_rel = f"{d.date}/{d.name}/image_02/data/{k:010d}.png"
        write_kitti_rgb(data_path / rgb_rel, img)
        gt_rel = "None"
        if KITTI_UNANNOTATED_ENDS <= k < d.frames - KITTI_UNANNOTATED_ENDS:
            gt_rel = f"{d.name}/proj_depth/groundtruth/image_02/{k:010d}.png"
            write_kitti_depth(gt_path / gt_rel, _lidar_mask(depth, cam, T, rng))
        lines.append(f"{rgb_rel} {gt_rel} {cam.fx:.4f}")
        if progress is not None:
            progress.update()
    return lines


def generate_kitti(
    out: Path, profile: DataSizes, seed: int, progress: tqdm, workers: int
) -> list[dict[str, Any]]:
    root = out / "kitti"
    data_path, gt_path = root / "raw", root / "gt"
    drives = kitti_drives(profile, seed)
    for date in sorted({d.date for d in drives}):
        write_kitti_calib(
            data_path / date / "calib_cam_to_cam.txt", _kitti_camera(date, profile.kitti_scale)
        )
    tasks = [(d, root, seed, profile) for d in drives]
    drive_lines = run_tasks(_render_drive, tasks, [d.frames for d in drives], workers, progress)
    lines: dict[str, list[str]] = {"train": [], "test": []}
    line_of: dict[str, list[int]] = {}
    for d, dl in zip(drives, drive_lines, strict=True):
        start = len(lines[d.split])
        lines[d.split] += dl
        line_of[d.name] = list(range(start + 1, start + len(dl) + 1))
    split_files = {
        "train": root / "eigen_train_files_with_gt.txt",
        "test": root / "eigen_test_files_with_gt.txt",
    }
    for split, f in split_files.items():
        f.write_text("\n".join(lines[split]) + "\n")
    entries = []
    for d in drives:
        short = d.name.removesuffix("_sync")
        name = f"kitti_{short}" if d.split == "train" else f"kitti_test_{short}"
        n_gt = d.frames - 2 * KITTI_UNANNOTATED_ENDS
        entries.append(
            {
                "name": name,
                "split": d.split,
                "client": name if d.split == "train" else None,
                "platform": "car",
                "environment": "urban_day",
                "source": "kitti",
                "site": d.style,
                "min_depth": depth_range.OUTDOOR.min_depth,
                "max_depth": depth_range.OUTDOOR.max_depth,
                "num_samples": n_gt,
                "files": {
                    "split_file": split_files[d.split].relative_to(out).as_posix(),
                    "data_path": data_path.relative_to(out).as_posix(),
                    "gt_path": gt_path.relative_to(out).as_posix(),
                },
                "lines": line_of[d.name],
            }
        )
    return entries
