"""Scenario engine: ray casting, environments, motion, and round trips through the readers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io

from fedepth.data import load_scenario
from fedepth.data.camera import Camera
from fedepth.data.m3ed import M3EDSequence
from fedepth.data.synth import environments
from fedepth.data.synth.generate import (
    build_site,
    clear_trajectory,
    generate_m3ed,
    min_camera_height,
    site_length,
    synthesize,
)
from fedepth.data.synth.platforms import PLATFORMS
from fedepth.data.synth.render import Renderer, day_lighting, night_lighting
from fedepth.data.synth.scenarios import DATA_SIZES, hpe_plan
from fedepth.data.synth.trajectory import Trajectory
from fedepth.data.synth.validate import reprojection_agreement
from fedepth.data.synth.world import Lane, WorldBuilder
from fedepth.data.synth.world import Path as Route


def _wall_world(distance: float) -> environments.World:
    b = WorldBuilder()
    b.add("box", "concrete", [distance + 0.5, 0.0, -5.0], (1.0, 20.0, 10.0))
    return b.build(Route(np.array([[0.0, 0.0], [1.0, 0.0]])), "outdoor", {"default": Lane(0)}, 0)


def _looking_along_x() -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    return T


def test_embree_depth_is_the_z_distance_to_a_wall() -> None:
    cam = Camera(32, 24, 20.0, 20.0, 15.5, 11.5, (-0.1, 0.05, 0.0, 0.0))
    _, depth = Renderer(_wall_world(7.0)).render(cam, _looking_along_x())
    assert depth.shape == (24, 32)
    assert np.allclose(depth, 7.0, atol=1e-4)  # z-depth, not ray length, even at the corners
    _, capped = Renderer(_wall_world(7.0)).render(cam, _looking_along_x(), max_range=6.0)
    assert not capped.any()  # beyond range is invalid


def test_sky_has_no_depth_and_the_image_is_8_bit_rgb() -> None:
    cam = Camera(32, 24, 20.0, 20.0, 15.5, 11.5)
    T = _looking_along_x()
    T[:3, :3] = T[:3, :3] @ np.array([[1.0, 0, 0], [0, 0.0, 1.0], [0, -1.0, 0.0]])  # look up
    img, depth = Renderer(_wall_world(7.0)).render(
        cam, T, lighting=day_lighting(np.random.default_rng(0))
    )
    assert img is not None and img.dtype == np.uint8 and img.shape == (24, 32, 3)
    assert not depth.any()


@pytest.mark.parametrize("style", sorted(environments.ROOM_STYLES))
def test_rooms_stay_under_ten_metres(style: str) -> None:
    rng = np.random.default_rng(1)
    world = environments.indoor(rng, style, 0.6)
    traj = Trajectory(world, PLATFORMS["spot"], "indoor", rng, 20.0)
    cam = Camera(64, 48, 50.0, 50.0, 31.5, 23.5)
    r = Renderer(world)
    for t in np.linspace(0, 20, 5):
        _, depth = r.render(cam, traj.pose(float(t)))
        assert depth.min() > 0.05  # closed room, camera never inside furniture
        assert depth.max() < 9.6


@pytest.mark.parametrize("platform", ["spot", "falcon"])
@pytest.mark.parametrize("style", sorted(environments.ROOM_STYLES))
def test_indoor_trajectories_keep_the_platform_standoff(platform: str, style: str) -> None:
    rng = np.random.default_rng(3)
    plat = PLATFORMS[platform]
    world = environments.indoor(rng, style, 0.6)
    probe_times = np.arange(0.0, 20.0, 0.5)
    traj = clear_trajectory(
        world, plat, "indoor", rng, 20.0, plat.rig.event, probe_times, f"{platform}_{style}"
    )
    # checked at a finer resolution than the probe, and between the probed times
    cam = plat.rig.event.resized(64, 36)
    r = Renderer(world)
    for t in np.arange(0.0, 20.0, 0.25):
        _, depth = r.render(cam, traj.pose(float(t)))
        assert np.median(depth[depth > 0]) >= 0.8 * plat.standoff, (style, t)


def test_a_standoff_no_trajectory_keeps_is_reported_and_the_clearest_is_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = np.random.default_rng(4)
    world = environments.indoor(rng, "bedroom", 0.6)
    spot = dataclasses.replace(PLATFORMS["spot"], standoff=50.0)  # farther than any wall
    with caplog.at_level("WARNING"):
        traj = clear_trajectory(world, spot, "indoor", rng, 5.0, spot.rig.event, [0.0, 2.5], "x")
    assert isinstance(traj, Trajectory)
    assert "no trajectory of 16 keeps the spot's 50.0 m standoff" in caplog.text


def test_depth_ranges_differ_between_environments() -> None:
    rng = np.random.default_rng(2)
    cam = Camera(64, 40, 44.0, 44.0, 31.5, 19.5)
    stats = {}
    for name, world in (
        ("road", environments.urban(rng, "highway", 600.0)),
        ("forest", environments.forest(rng, "dense", 400.0)),
        ("indoor", environments.indoor(rng, "office", 0.6)),
    ):
        traj = Trajectory(world, PLATFORMS["car"], "urban_day", rng, 10.0)
        d = np.concatenate([Renderer(world).render(cam, traj.pose(t))[1].ravel() for t in (0, 5)])
        stats[name] = np.percentile(d[d > 0], 95)
    assert stats["indoor"] < 10.0 < stats["forest"] < stats["road"]
    assert stats["road"] > 40.0


def test_night_is_darker_and_noisier_than_day() -> None:
    rng = np.random.default_rng(3)
    world = environments.urban(rng, "downtown", 400.0)
    traj = Trajectory(world, PLATFORMS["car"], "urban_day", rng, 5.0)
    cam = Camera(64, 40, 44.0, 44.0, 31.5, 19.5)
    r = Renderer(world)
    T = traj.pose(1.0)
    day, _ = r.render(cam, T, lighting=day_lighting(rng), rng=np.random.default_rng(0))
    night, _ = r.render(cam, T, lighting=night_lighting(rng), rng=np.random.default_rng(0))
    night2, _ = r.render(cam, T, lighting=night_lighting(rng), rng=np.random.default_rng(1))
    assert day is not None and night is not None and night2 is not None
    assert night.mean() < 0.5 * day.mean()
    # same scene, two noise draws: the gain-amplified noise shows at night
    assert np.abs(night.astype(int) - night2.astype(int)).mean() > 0.5


def test_motion_models() -> None:
    rng = np.random.default_rng(4)
    world = environments.urban(rng, "campus", 600.0)
    t = np.arange(0, 8, 0.01)

    def series(platform: str, env: str) -> np.ndarray:
        tr = Trajectory(world, PLATFORMS[platform], env, np.random.default_rng(5), 8.0)
        return np.array([tr.pose(float(x))[:3, 3] for x in t])

    spot = series("spot", "urban_day")
    car = series("car", "urban_day")
    uav = series("falcon", "urban_day")
    # Spot's body bobs at twice its 1.6-2.2 Hz stride frequency
    z = spot[:, 2] - np.convolve(spot[:, 2], np.ones(101) / 101, mode="same")
    spec = np.abs(np.fft.rfft(z[100:-100]))
    freq = np.fft.rfftfreq(z[100:-100].size, 0.01)
    assert 3.2 <= freq[np.argmax(spec[1:]) + 1] <= 4.4
    assert abs(np.median(spot[:, 2]) - (0.6 + 0.15)) < 0.05  # on the sidewalk
    assert abs(np.median(car[:, 2]) - 1.5) < 0.05 and car[:, 2].std() < 0.02
    assert uav[:, 2].min() > 4.0 and uav[:, 2].max() < 35.0
    speed = np.linalg.norm(np.diff(car[:, :2], axis=0), axis=1) / 0.01
    assert 3.0 < speed.mean() < 11.0


def test_hpe_plan_mirrors_m3ed() -> None:
    plan = hpe_plan(DATA_SIZES["small"], 0)
    train = [p for p in plan if p.split == "train"]
    test = [p for p in plan if p.split == "test"]
    pre = [p for p in plan if p.split == "pretrain"]
    assert len(train) == 41 and len(test) == 11 and len(pre) == 8
    combos = {(p.platform, p.environment) for p in test}
    assert len(combos) == 11 and combos == {(p.platform, p.environment) for p in train}
    assert {p.site.key for p in pre}.isdisjoint({p.site.key for p in train + test})
    counts = [p.samples for p in train]
    assert min(counts) >= 30 and max(counts) <= 90 and len(set(counts)) > 10


def test_reprojected_depth_agrees_with_depth_rendered_in_the_rgb_camera(tmp_path: Path) -> None:
    """The event-camera depth read back through M3EDSequence against a direct RGB render."""
    prof = DATA_SIZES["small"]
    results = {}
    for name in ("car_urban_day_penno_small_loop", "spot_forest_easy_1", "falcon_indoor_flight_1"):
        plan = next(p for p in hpe_plan(prof, 0) if p.name == name)
        plan = dataclasses.replace(plan, samples=4)
        world = build_site(plan.site, 0, site_length([plan], plan.site), min_camera_height([plan]))
        results[name] = reprojection_agreement(
            generate_m3ed(plan, world, tmp_path, 0, prof), world
        )
    print("\nreprojection agreement:", results)
    for a in results.values():
        assert a.frames == 4
        assert a.median_abs_rel < 0.01 and a.p90_abs_rel < 0.05
        assert a.coverage_in_view > 0.9
        assert 0.3 < a.coverage < a.coverage_in_view  # the RGB lens sees more than the event one


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smoke")
    return {s: synthesize(s, "smoke", 0, root / s, progress=False).parent for s in ("hpe", "bmr")}


def test_hpe_smoke_round_trip(smoke: dict[str, Path]) -> None:
    sc = load_scenario(smoke["hpe"])
    manifest = json.loads((smoke["hpe"] / "manifest.json").read_text())
    assert (
        sc.name == "hpe" and len(sc.clients) == 4 and len(sc.test) == 2 and len(sc.pretrain) == 1
    )
    assert {c.environment for c in sc.clients} == {"urban_day", "urban_night", "forest", "indoor"}
    by_name = {c["name"]: c for c in manifest["clients"]}
    for c in sc.clients:
        assert c.num_samples == by_name[c.name]["num_samples"] > 0
        f = c.sequences[0][0]
        assert f.rgb.shape == (25, 40, 3) and f.depth.shape == (25, 40)
        assert f.valid.mean() > 0.3
        if c.environment == "indoor":
            assert f.depth.max() < 10.0
    with h5py.File(smoke["hpe"] / "train" / "spot_forest_easy_1_data.h5") as h:
        assert h["/ovc/rgb/data"].shape[1:] == (25, 40, 3)
        assert h["/ovc/ts"].dtype == np.int64 and np.all(np.diff(h["/ovc/ts"][:]) == 40_000)
        assert h["/prophesee/left/calib/resolution"][:].tolist() == [40, 23]
    with h5py.File(smoke["hpe"] / "train" / "spot_forest_easy_1_depth_gt.h5") as h:
        d = h["/depth/prophesee/left"][:]
        assert d.shape[1:] == (23, 40) and np.isinf(d).any() and (d[np.isfinite(d)] > 0).all()
    sc.close()


def test_bmr_smoke_round_trip(smoke: dict[str, Path]) -> None:
    sc = load_scenario(smoke["bmr"])
    sources = {c.sequences[0].meta.source for c in sc.clients}
    assert sources == {"nyu", "kitti"} and len(sc.clients) == 6
    nyu = [c for c in sc.clients if c.environment == "indoor"]
    kitti = [c for c in sc.clients if c.environment == "urban_day"]
    assert all(c.sequences[0].meta.max_depth == 10.0 for c in nyu)
    assert all(c.sequences[0].meta.max_depth == 80.0 for c in kitti)
    f = nyu[0].sequences[0][0]
    assert f.rgb.shape == (24, 32, 3) and f.valid.all() and f.depth.max() < 10.0
    g = kitti[0].sequences[0][0]
    assert g.valid.mean() < 0.5  # sparse LiDAR annotation, no sky
    root = smoke["bmr"]
    mat = root / "nyu" / "nyu_depth_v2_labeled.mat"
    assert mat.read_bytes()[:10] == b"MATLAB 7.3"
    with pytest.raises(NotImplementedError):  # scipy refuses v7.3 files, as with the real one
        scipy.io.loadmat(mat)
    splits = scipy.io.loadmat(root / "nyu" / "splits.mat")
    assert splits["trainNdxs"].min() == 1 and splits["trainNdxs"].shape[1] == 1
    lines = (root / "kitti" / "eigen_test_files_with_gt.txt").read_text().splitlines()
    assert lines[0].split()[1] == "None" and len(lines[5].split()) == 3
    sc.close()


def test_generation_is_deterministic_per_seed(smoke: dict[str, Path], tmp_path: Path) -> None:
    # two worker processes, same seed: the same data as the sequential run
    again = synthesize("hpe", "smoke", 0, tmp_path / "a", progress=False, workers=2).parent
    other = synthesize("hpe", "smoke", 1, tmp_path / "b", progress=False).parent
    name = "falcon_indoor_flight_1"
    ref, same, diff = (
        M3EDSequence(r / "train" / f"{name}_data.h5", r / "train" / f"{name}_depth_gt.h5")
        for r in (smoke["hpe"], again, other)
    )
    assert len(ref) == len(same)
    for i in range(len(ref)):
        assert np.array_equal(ref[i].rgb, same[i].rgb)
        assert np.array_equal(ref[i].depth, same[i].depth)
    assert not np.array_equal(ref[0].rgb, diff[0].rgb)
    assert (again / "manifest.json").read_text() == (smoke["hpe"] / "manifest.json").read_text()


def test_the_pretraining_split_alone_has_the_whole_scenarios_frames(
    smoke: dict[str, Path], tmp_path: Path
) -> None:
    # what a coordinator generates to pretrain the model it serves: no client, no test sequence
    for scenario in ("hpe", "bmr"):
        alone = synthesize(scenario, "smoke", 0, tmp_path / scenario, pretraining_only=True)
        sc, whole = load_scenario(alone.parent), load_scenario(smoke[scenario])
        assert json.loads(alone.read_text())["pretraining_only"] is True
        assert not sc.clients and not sc.test and not (alone.parent / "train").exists()
        assert [s.name for s in sc.pretrain] == [s.name for s in whole.pretrain]
        for mine, theirs in zip(sc.pretrain, whole.pretrain, strict=True):
            assert len(mine) == len(theirs) > 0
            for i in range(len(mine)):
                assert np.array_equal(mine[i].rgb, theirs[i].rgb)
                assert np.array_equal(mine[i].depth, theirs[i].depth)
        sc.close()
        whole.close()


def test_place_variants_share_geometry() -> None:
    plan = hpe_plan(DATA_SIZES["small"], 0)
    penno = next(p.site for p in plan if p.name == "car_urban_night_penno_big_loop")
    beams = next(p.site for p in plan if p.name == "falcon_outdoor_night_high_beams")
    assert penno.key == beams.key and penno != beams
    a = build_site(penno, 0, site_length(plan, penno))
    b = build_site(beams, 0, site_length(plan, beams))
    n = a.num_faces
    assert b.num_faces > n and np.array_equal(a.vertices, b.vertices[: a.vertices.shape[0]])
    assert len(b.lights) == len(a.lights) + 2  # the parked car's two high beams
