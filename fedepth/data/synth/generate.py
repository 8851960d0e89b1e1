"""Generate a scenario: render every planned sequence and write it in its dataset's format.

``synthesize("hpe", "small", seed=0, out=DIR)`` writes M3ED h5 pairs under ``DIR/train``,
``DIR/test`` and ``DIR/pretrain``; ``synthesize("bmr", ...)`` writes ``DIR/nyu`` (labeled .mat +
splits.mat), ``DIR/kitti`` (raw + annotated-depth trees and Eigen-style split files) and the
same kind of pretraining split. ``DIR/manifest.json`` (written last) lists every sequence with
its files, platform, environment, split and client; :func:`fedepth.data.scenario.load_scenario`
reads it back. The same seed gives the same data.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from fedepth import __version__, depth_range
from fedepth.data.camera import Camera
from fedepth.data.synth import environments
from fedepth.data.synth.formats import (
    M3EDWriter,
    NYUWriter,
    write_kitti_calib,
    write_kitti_depth,
    write_kitti_rgb,
    write_nyu_splits,
)
from fedepth.data.synth.platforms import (
    KITTI_CAMERA_HEIGHT,
    KITTI_DATES,
    KITTI_LIDAR_FOV_DEG,
    KITTI_LIDAR_HEIGHT,
    NYU_CAM,
    PLATFORMS,
    Platform,
    Rig,
)
from fedepth.data.synth.render import (
    Lighting,
    Renderer,
    day_lighting,
    indoor_lighting,
    night_lighting,
)
from fedepth.data.synth.scenarios import (
    DATA_SIZES,
    KITTI_STYLES,
    NYU_CLIENT_TYPES,
    NYU_TEST_TYPES,
    DataSizes,
    SequencePlan,
    Site,
    hpe_plan,
    pretrain_plan,
    stable_seed,
)
from fedepth.data.synth.trajectory import Trajectory
from fedepth.data.synth.world import Lights, World

log = logging.getLogger(__name__)
F64 = npt.NDArray[np.float64]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "fedepth-scenario"
MANIFEST_VERSION = 1
#: Version of what a seed generates: bump it when a change alters the rendered data, so caches
#: keyed by it (``fedepth bench``'s scenarios and pretrained checkpoints) are not reused.
#: 2: trajectories keep their platform's standoff (:func:`clear_trajectory`).
GENERATOR_VERSION = 2
SCENARIOS = ("hpe", "bmr")
#: Sensor rates: OVC RGB 25 Hz (M3ED retimes frames to multiples of 40 ms), Ouster LiDAR and
#: KITTI's Velodyne at 10 Hz.
RGB_PERIOD_US = 40_000
DEPTH_PERIOD_US = 100_000
#: Ouster OS1-64 (M3ED) and Velodyne HDL-64E (KITTI) ranges are of the order of 120 m.
LIDAR_RANGE = 120.0
#: Headlight low beams: ~20 kcd each on axis (= 0.4 in units of 50 klux at 1 m); intensity
#: falls off within ~10-15 deg of the axis (the hot spot lights the road tens of metres ahead).
HEADLIGHT_POWER, HEADLIGHT_CONE = 0.4, 0.22
#: KITTI's annotated depth is semi-dense: fraction of pixels inside the LiDAR's field of view
#: that keep a value (an order-of-magnitude assumption, not a measured figure), and frames at
#: each end of a drive that have no annotation (the accumulation window needs neighbours).
KITTI_DENSITY = 0.3
KITTI_UNANNOTATED_ENDS = 5
#: Trajectories drawn for a sequence before settling for the clearest one (see
#: :func:`clear_trajectory`), and the coarse view (width, height) clearance is probed with.
TRAJECTORY_ATTEMPTS = 16
PROBE_SIZE = (16, 12)


def view_depth(renderer: Renderer, probe: Camera, T_world_cam: F64) -> float:
    """Median z-depth (m) of what ``probe`` sees at a pose; inf when it sees only sky."""
    _, depth = renderer.render(probe, T_world_cam, max_range=LIDAR_RANGE)
    hit = depth[depth > 0]
    return float(np.median(hit)) if hit.size else float("inf")


def clear_trajectory(
    world: World,
    platform: Platform,
    environment: str,
    rng: np.random.Generator,
    duration: float,
    cam: Camera,
    times: npt.ArrayLike,
    name: str,
) -> Trajectory:
    """A trajectory along which ``cam``'s view keeps the platform's standoff at every time in
    ``times`` (seconds): no robot of a real recording drives, walks or flies its camera into a
    wall. Trajectories are drawn from ``rng`` until one keeps it (deterministic for a seed);
    after :data:`TRAJECTORY_ATTEMPTS` the clearest one is kept, with a warning.

    Without this, a loop around a small room could face a wall at 0.2 m for a third of a test
    sequence while no training sequence came closer than 1.7 m (HPE small, seed 0).
    """
    renderer = Renderer(world)
    probe = cam.resized(*PROBE_SIZE)
    best: tuple[float, Trajectory] | None = None
    for _ in range(TRAJECTORY_ATTEMPTS):
        traj = Trajectory(world, platform, environment, rng, duration)
        clearance = min(
            view_depth(renderer, probe, traj.pose(float(t))) for t in np.asarray(times).ravel()
        )
        if clearance >= platform.standoff:
            return traj
        if best is None or clearance > best[0]:
            best = (clearance, traj)
    assert best is not None
    log.warning(
        "%s: no trajectory of %d keeps the %s's %.1f m standoff; the clearest comes to %.2f m",
        name,
        TRAJECTORY_ATTEMPTS,
        platform.name,
        platform.standoff,
        best[0],
    )
    return best[1]


def lighting_for(environment: str, rng: np.random.Generator) -> Lighting:
    if environment == "urban_night":
        return night_lighting(rng)
    if environment == "indoor":
        return indoor_lighting(rng)
    return day_lighting(rng)


def build_site(site: Site, seed: int, length: float, min_camera_height: float = 0.6) -> World:
    """The world of a place (same seed and site -> same geometry)."""
    rng = np.random.default_rng(stable_seed(seed, "site", site.key, site.family, site.style))
    if site.family == "indoor":
        return environments.indoor(rng, site.style, min_camera_height)
    if site.family == "urban":
        return environments.urban(rng, site.style, length, site.extras)
    return environments.forest(rng, site.style, length)


def site_length(plans: list[SequencePlan], site: Site) -> float:
    """Route length that fits every sequence recorded at the place, plus margins (variants of a
    place, such as Pennovation with a car's high beams on, get the same length and geometry)."""
    travel = 0.0
    for p in plans:
        if p.site.key == site.key:
            vmax = PLATFORMS[p.platform].speed_range(p.environment)[1]
            travel = max(travel, vmax * (p.samples / 10.0 + 1.0) * 1.2)
    margin = environments.URBAN_MARGIN if site.family == "urban" else environments.FOREST_MARGIN
    return travel + 2 * margin + 40.0


def min_camera_height(plans: list[SequencePlan]) -> float:
    """The lowest camera above the floor among the platforms recorded at a place."""
    heights = []
    for p in plans:
        pf = PLATFORMS[p.platform]
        heights.append(
            pf.altitude[p.environment][0]
            if pf.altitude and p.environment in pf.altitude
            else pf.height
        )
    return min(heights)


@dataclass
class M3EDRecord:
    """What was rendered for one M3ED-format sequence (tests re-render from it)."""

    plan: SequencePlan
    rig: Rig
    trajectory: Trajectory
    lighting: Lighting
    rgb_ts: npt.NDArray[np.int64]
    depth_ts: npt.NDArray[np.int64]
    data_path: Path
    depth_path: Path


def headlights(platform: str, lighting: Lighting, T_world_cam: F64) -> Lights | None:
    """A car's low beams at night: ~0.7 m either side, ~0.85 m below and 1.5 m ahead of the
    roof camera, aimed 2 deg down."""
    if lighting.name != "night" or not PLATFORMS[platform].headlight:
        return None
    R, t = T_world_cam[:3, :3], T_world_cam[:3, 3]
    pos = np.array([[-0.7, 0.85, 1.5], [0.7, 0.85, 1.5]]) @ R.T + t
    axis = R @ np.array([0.0, np.sin(np.deg2rad(2.0)), np.cos(np.deg2rad(2.0))])
    return Lights.make(pos, HEADLIGHT_POWER, (1.0, 0.92, 0.8), axis, HEADLIGHT_CONE)


def generate_m3ed(
    plan: SequencePlan,
    world: World,
    out_dir: Path,
    seed: int,
    profile: DataSizes,
    progress: tqdm | None = None,
) -> M3EDRecord:
    """Render one sequence and write ``<name>_data.h5`` / ``<name>_depth_gt.h5``.

    The RGB camera renders images at 25 Hz; the left event camera renders depth at the LiDAR's
    10 Hz with its own intrinsics, distortion and pose, so reading the pair back exercises the
    reprojection into the RGB camera.
    """
    rng = np.random.default_rng(stable_seed(seed, "sequence", plan.name))
    platform = PLATFORMS[plan.platform]
    rig = platform.rig.calibrated(f"{seed}/{plan.platform}_{plan.environment}")
    rig = dataclasses.replace(
        rig,
        event=rig.event.resized(profile.event_size[1], profile.event_size[0]),
        rgb=rig.rgb.resized(profile.rgb_size[1], profile.rgb_size[0]),
    )
    lighting = lighting_for(plan.environment, rng)
    offset = int(rng.integers(20_000, 60_000))
    depth_ts = offset + np.arange(plan.samples, dtype=np.int64) * DEPTH_PERIOD_US
    depth_ts += rng.integers(-300, 300, plan.samples)
    n_rgb = int(np.ceil((depth_ts[-1] + RGB_PERIOD_US) / RGB_PERIOD_US)) + 1
    rgb_ts = np.arange(n_rgb, dtype=np.int64) * RGB_PERIOD_US
    duration = rgb_ts[-1] / 1e6
    traj = clear_trajectory(
        world, platform, plan.environment, rng, duration, rig.event, depth_ts / 1e6, plan.name
    )
    renderer = Renderer(world)
    note = f"synthetic (fedepth synth seed {seed})"
    with closing(M3EDWriter(out_dir, plan.name, rig, rgb_ts, depth_ts, note)) as w:
        for i, ts in enumerate(rgb_ts):
            T_ev = traj.pose(ts / 1e6)
            T_rgb = T_ev @ rig.T_event_rgb
            img, _ = renderer.render(
                rig.rgb,
                T_rgb,
                lighting=lighting,
                extra_lights=headlights(plan.platform, lighting, T_rgb),
                rng=rng,
            )
            assert img is not None
            w.write_rgb(i, img)
            if progress is not None:
                progress.update()
        for j, ts in enumerate(depth_ts):
            T_ev = traj.pose(ts / 1e6)
            _, depth = renderer.render(rig.event, T_ev, max_range=LIDAR_RANGE)
            w.write_depth(j, depth, T_ev)
            if progress is not None:
                progress.update()
    return M3EDRecord(plan, rig, traj, lighting, rgb_ts, depth_ts, w.data_path, w.depth_path)


def _m3ed_entry(rec: M3EDRecord, root: Path, client: str | None) -> dict[str, Any]:
    p = rec.plan
    caps = depth_range.for_environment(p.environment)
    return {
        "name": p.name,
        "split": p.split,
        "client": client,
        "platform": p.platform,
        "environment": p.environment,
        "source": "m3ed",
        "site": p.site.key,
        "min_depth": caps.min_depth,
        "max_depth": caps.max_depth,
        "num_samples": p.samples,
        "files": {
            "data": rec.data_path.relative_to(root).as_posix(),
            "depth": rec.depth_path.relative_to(root).as_posix(),
        },
    }


_SiteTask = tuple[Site, list[SequencePlan], float, Path, int, DataSizes]


def _render_site(task: _SiteTask, progress: tqdm | None = None) -> list[dict[str, Any]]:
    """Build one place and render every sequence recorded there."""
    site, group, length, out, seed, profile = task
    world = build_site(site, seed, length, min_camera_height(group))
    entries = []
    for p in group:
        rec = generate_m3ed(p, world, out / p.split, seed, profile, progress)
        entries.append(_m3ed_entry(rec, out, p.name if p.split == "train" else None))
    return entries


def _render_m3ed_plans(
    plans: list[SequencePlan],
    out: Path,
    seed: int,
    profile: DataSizes,
    progress: tqdm,
    workers: int,
) -> list[dict[str, Any]]:
    by_site: dict[Site, list[SequencePlan]] = {}
    for p in plans:
        by_site.setdefault(p.site, []).append(p)
    tasks = [
        (site, group, site_length(plans, site), out, seed, profile)
        for site, group in by_site.items()
    ]
    weights = [_m3ed_frames(group) for group in by_site.values()]
    entries = [e for res in _run(_render_site, tasks, weights, workers, progress) for e in res]
    order = {p.name: k for k, p in enumerate(plans)}
    return sorted(entries, key=lambda e: order[e["name"]])


def _call(job: tuple[int, Callable[[Any], Any], Any]) -> tuple[int, Any]:
    k, fn, task = job
    return k, fn(task)


def _run(
    fn: Callable[..., Any], tasks: list[Any], weights: list[int], workers: int, progress: tqdm
) -> list[Any]:
    """``[fn(t) for t in tasks]``, in ``workers`` processes when > 1 (results in task order;
    every task seeds its own generators, so the output does not depend on ``workers``)."""
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t, progress) for t in tasks]
    results: list[Any] = [None] * len(tasks)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(workers, len(tasks))) as pool:
        jobs = [(k, fn, t) for k, t in enumerate(tasks)]
        for k, res in pool.imap_unordered(_call, jobs):
            results[k] = res
            progress.update(weights[k])
    return results


def _m3ed_frames(plans: list[SequencePlan]) -> int:
    return sum(
        p.samples + int(np.ceil((p.samples * DEPTH_PERIOD_US + 100_000) / RGB_PERIOD_US))
        for p in plans
    )


# --------------------------------------------------------------------------------------------
# BMR: NYUv2-like indoor images and KITTI-like drives


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


def _generate_nyu(
    out: Path, profile: DataSizes, seed: int, progress: tqdm
) -> list[dict[str, Any]]:
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


def _kitti_drives(profile: DataSizes, seed: int) -> list[_KittiDriveSpec]:
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


def _generate_kitti(
    out: Path, profile: DataSizes, seed: int, progress: tqdm, workers: int
) -> list[dict[str, Any]]:
    root = out / "kitti"
    data_path, gt_path = root / "raw", root / "gt"
    drives = _kitti_drives(profile, seed)
    for date in sorted({d.date for d in drives}):
        write_kitti_calib(
            data_path / date / "calib_cam_to_cam.txt", _kitti_camera(date, profile.kitti_scale)
        )
    tasks = [(d, root, seed, profile) for d in drives]
    drive_lines = _run(_render_drive, tasks, [d.frames for d in drives], workers, progress)
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


# --------------------------------------------------------------------------------------------


def _bar(total: int, enabled: bool, desc: str) -> tqdm:
    """A progress bar over rendered frames."""
    return tqdm(total=total, disable=not enabled, desc=desc, unit="frame", dynamic_ncols=True)


def synthesize(
    scenario: str,
    profile: str,
    seed: int,
    out: str | Path,
    *,
    progress: bool = True,
    workers: int = 1,
) -> Path:
    """Generate a scenario into ``out`` and return the manifest's path.

    ``workers`` > 1 renders places (M3ED format) and drives (KITTI) in that many processes; the
    data are the same whatever the number.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (choose from {', '.join(SCENARIOS)})")
    if profile not in DATA_SIZES:
        raise ValueError(f"unknown profile {profile!r} (choose from {', '.join(DATA_SIZES)})")
    prof = DATA_SIZES[profile]
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    if scenario == "hpe":
        plans = hpe_plan(prof, seed)
        with _bar(_m3ed_frames(plans), progress, "hpe") as bar:
            entries = _render_m3ed_plans(plans, root, seed, prof, bar, workers)
    else:
        pre = pretrain_plan(prof, seed)
        n_nyu = prof.nyu_train + prof.nyu_test
        n_kitti = sum(d.frames for d in _kitti_drives(prof, seed))
        with _bar(n_nyu + n_kitti + _m3ed_frames(pre), progress, "bmr") as bar:
            entries = _generate_nyu(root, prof, seed, bar)
            entries += _generate_kitti(root, prof, seed, bar, workers)
            entries += _render_m3ed_plans(pre, root, seed, prof, bar, workers)
    clients: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e["client"] is not None:
            c = clients.setdefault(
                e["client"],
                {
                    "name": e["client"],
                    "platform": e["platform"],
                    "environment": e["environment"],
                    "sequences": [],
                    "num_samples": 0,
                },
            )
            c["sequences"].append(e["name"])
            c["num_samples"] += e["num_samples"]
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "scenario": scenario,
        "profile": profile,
        "seed": seed,
        "generator": f"fedepth {__version__}",
        "generator_version": GENERATOR_VERSION,
        "clients": list(clients.values()),
        "sequences": entries,
    }
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    log.info("wrote %s (%d sequences)", path, len(entries))
    return path
