"""Generate a scenario: render every planned sequence and write it in its dataset's format.

``synthesize("hpe", "small", seed=0, out=DIR)`` writes M3ED h5 pairs under ``DIR/train``,
``DIR/test`` and ``DIR/pretrain``; ``synthesize("bmr", ...)`` writes ``DIR/nyu`` (labeled .mat +
splits.mat), ``DIR/kitti`` (raw + annotated-depth trees and Eigen-style split files) and the
same kind of pretraining split. ``DIR/manifest.json`` (written last) lists every sequence with
its files, platform, environment, split and client; :func:`fedepth.data.scenario.load_scenario`
reads it back. The same seed gives the same data.

This module renders the M3ED-format sequences and drives the whole; the NYUv2 and KITTI
formats are rendered by :mod:`fedepth.data.synth.nyu_kitti`, trajectories are kept clear of
walls by :mod:`fedepth.data.synth.clearance`, and :mod:`fedepth.data.synth.parallel` runs the
places and drives in worker processes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from fedepth import __version__, depth_range
from fedepth.data.synth import environments
from fedepth.data.synth.clearance import LIDAR_RANGE, clear_trajectory
from fedepth.data.synth.formats import M3EDWriter
from fedepth.data.synth.nyu_kitti import generate_kitti, generate_nyu, kitti_drives
from fedepth.data.synth.parallel import run_tasks
from fedepth.data.synth.platforms import PLATFORMS, Rig
from fedepth.data.synth.render import (
    Lighting,
    Renderer,
    day_lighting,
    indoor_lighting,
    night_lighting,
)
from fedepth.data.synth.scenarios import (
    DATA_SIZES,
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
#: Headlight low beams: ~20 kcd each on axis (= 0.4 in units of 50 klux at 1 m); intensity
#: falls off within ~10-15 deg of the axis (the hot spot lights the road tens of metres ahead).
HEADLIGHT_POWER, HEADLIGHT_CONE = 0.4, 0.22


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
    results = run_tasks(_render_site, tasks, weights, workers, progress)
    entries = [e for res in results for e in res]
    order = {p.name: k for k, p in enumerate(plans)}
    return sorted(entries, key=lambda e: order[e["name"]])


def _m3ed_frames(plans: list[SequencePlan]) -> int:
    return sum(
        p.samples + int(np.ceil((p.samples * DEPTH_PERIOD_US + 100_000) / RGB_PERIOD_US))
        for p in plans
    )


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
    pretraining_only: bool = False,
) -> Path:
    """Generate a scenario into ``out`` and return the manifest's path.

    ``workers`` > 1 renders places (M3ED format) and drives (KITTI) in that many processes; the
    data are the same whatever the number. ``pretraining_only``: only the pretraining split
    (no client, no test sequence; the manifest says so), the same frames as the whole
    scenario's pretraining split, since its places are recorded by no client or test sequence
    (what a coordinator needs to pretrain the model it serves, in a fraction of the time).
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (choose from {', '.join(SCENARIOS)})")
    if profile not in DATA_SIZES:
        raise ValueError(f"unknown profile {profile!r} (choose from {', '.join(DATA_SIZES)})")
    prof = DATA_SIZES[profile]
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    if scenario == "hpe" and not pretraining_only:
        plans = hpe_plan(prof, seed)
        with _bar(_m3ed_frames(plans), progress, "hpe") as bar:
            entries = _render_m3ed_plans(plans, root, seed, prof, bar, workers)
    elif pretraining_only:
        pre = pretrain_plan(prof, seed)
        with _bar(_m3ed_frames(pre), progress, scenario) as bar:
            entries = _render_m3ed_plans(pre, root, seed, prof, bar, workers)
    else:
        pre = pretrain_plan(prof, seed)
        n_nyu = prof.nyu_train + prof.nyu_test
        n_kitti = sum(d.frames for d in kitti_drives(prof, seed))
        with _bar(n_nyu + n_kitti + _m3ed_frames(pre), progress, "bmr") as bar:
            entries = generate_nyu(root, prof, seed, bar)
            entries += generate_kitti(root, prof, seed, bar, workers)
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
    if pretraining_only:
        manifest["pretraining_only"] = True
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    log.info("wrote %s (%d sequences)", path, len(entries))
    return path
