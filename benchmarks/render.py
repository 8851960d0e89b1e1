"""Scenario-engine benchmark: render speed per environment, HPE `small` generation time, and the
agreement of the M3ED reader's reprojected depth with depth rendered in the RGB camera.

    python benchmarks/render.py                 # all three (HPE small takes minutes)
    python benchmarks/render.py --skip-generation --json runs/bench/render.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.data.synth import environments
from fedepth.data.synth.generate import (
    build_site,
    generate_m3ed,
    headlights,
    lighting_for,
    min_camera_height,
    site_length,
    synthesize,
)
from fedepth.data.synth.platforms import PLATFORMS
from fedepth.data.synth.render import Renderer
from fedepth.data.synth.scenarios import DATA_SIZES, hpe_plan
from fedepth.data.synth.trajectory import Trajectory
from fedepth.data.synth.validate import reprojection_agreement

#: (environment, platform, world builder) timed at 96 x 128.
CASES = (
    ("forest", "spot", lambda rng: environments.forest(rng, "dense", 400.0)),
    ("urban_day", "car", lambda rng: environments.urban(rng, "downtown", 400.0)),
    ("urban_night", "car", lambda rng: environments.urban(rng, "campus", 400.0)),
    ("indoor", "handheld", lambda rng: environments.indoor(rng, "living_room", 1.4)),
)
AGREEMENT_SEQUENCES = (
    "car_urban_day_penno_small_loop",
    "car_urban_night_city_hall",
    "spot_forest_easy_1",
    "falcon_outdoor_day_penno_cars",
    "falcon_indoor_flight_1",
)


def render_speed(frames: int, size: tuple[int, int]) -> list[dict[str, Any]]:
    h, w = size
    rows = []
    for env, platform, build in CASES:
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        world = build(rng)
        world.scene  # noqa: B018 (builds the Embree BVH inside the timed section)
        t_build = time.perf_counter() - t0
        pf = PLATFORMS[platform]
        cam = pf.rig.rgb.resized(w, h)
        traj = Trajectory(world, pf, env, rng, frames / 10.0)
        light = lighting_for(env, rng)
        renderer = Renderer(world)
        poses = [traj.pose(k / 10.0) for k in range(frames)]
        t0 = time.perf_counter()
        for T in poses:
            renderer.render(cam, T, lighting=light, extra_lights=headlights(platform, light, T))
        t_rgb = time.perf_counter() - t0
        t0 = time.perf_counter()
        for T in poses:
            renderer.render(cam, T)
        t_depth = time.perf_counter() - t0
        rows.append(
            {
                "environment": env,
                "platform": platform,
                "faces": world.num_faces,
                "build_s": t_build,
                "rgb_depth_fps": frames / t_rgb,
                "depth_only_fps": frames / t_depth,
            }
        )
    return rows


def generation_time(scenario: str, profile: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fedepth-bench-") as tmp:
        t0 = time.perf_counter()
        manifest = synthesize(scenario, profile, 0, tmp, progress=False)
        seconds = time.perf_counter() - t0
        doc = json.loads(manifest.read_text())
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
    return {
        "scenario": scenario,
        "profile": profile,
        "seconds": seconds,
        "sequences": len(doc["sequences"]),
        "clients": len(doc["clients"]),
        "bytes": size,
    }


def agreement(samples: int) -> list[dict[str, Any]]:
    prof = DATA_SIZES["small"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedepth-bench-") as tmp:
        for name in AGREEMENT_SEQUENCES:
            plan = next(p for p in hpe_plan(prof, 0) if p.name == name)
            plan = dataclasses.replace(plan, samples=samples)
            world = build_site(
                plan.site, 0, site_length([plan], plan.site), min_camera_height([plan])
            )
            rec = generate_m3ed(plan, world, Path(tmp), 0, prof)
            rows.append(
                {"sequence": name, **dataclasses.asdict(reprojection_agreement(rec, world))}
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=60, help="frames timed per environment")
    ap.add_argument("--skip-generation", action="store_true", help="do not time HPE small")
    ap.add_argument(
        "--agreement-samples",
        type=int,
        default=10,
        help="depth samples per sequence for the reprojection check (0: skip)",
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    size = (96, 128)
    out: dict[str, Any] = {"render_size": list(size)}
    print(f"render speed at {size[0]}x{size[1]} ({args.frames} frames, 1 process):")
    out["render"] = render_speed(args.frames, size)
    for r in out["render"]:
        print(
            f"  {r['environment']:<12} {r['platform']:<9} {r['faces']:>7} faces  build "
            f"{r['build_s']:5.2f} s  rgb+depth {r['rgb_depth_fps']:6.1f} fps  depth only "
            f"{r['depth_only_fps']:6.1f} fps"
        )
    if args.agreement_samples > 0:
        out["agreement"] = agreement(args.agreement_samples)
        print("reprojected M3ED depth vs depth rendered in the RGB camera (small profile):")
        for r in out["agreement"]:
            print(
                f"  {r['sequence']:<34} median abs rel {r['median_abs_rel']:.4f}  p90 "
                f"{r['p90_abs_rel']:.4f}  coverage in event view {r['coverage_in_view']:.3f}"
                f"  of all RGB pixels with depth {r['coverage']:.3f}"
            )
    if not args.skip_generation:
        g = generation_time("hpe", "small")
        out["generation"] = g
        print(
            f"HPE small: {g['seconds']:.0f} s for {g['sequences']} sequences "
            f"({g['clients']} clients), {g['bytes'] / 2**20:.0f} MiB (target < 600 s)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
