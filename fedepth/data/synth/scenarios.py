"""The HPE and BMR scenario plans: which sequences exist, where they are recorded, and profiles.

HPE mirrors M3ED's sequence list. M3ED has 55 sequences with depth ground truth (its official
test files ship none) over 11 platform x environment combinations; the paper uses 41 training
clients and 11 unseen test sequences. The paper's exact split is in its supplement, which is not
available, so here: one test sequence per combination (11, "maximises coverage of
platform-environment combinations"), the rest training, minus one sequence in each of the three
largest combinations to reach 41. Sequences recorded at the same place share a world (M3ED's
Pennovation campus is driven, walked and flown over, by day and by night).

BMR: 15 NYUv2-like indoor clients (split by scene type in proportion to NYUv2's labeled set) and
17 KITTI-like outdoor clients (one drive each), plus NYUv2's and KITTI Eigen's test splits.

Both scenarios carry a pretraining split: sequences of every platform and environment at
places no client or test sequence visits, standing in for the ImageNet pretraining of encoders.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from fedepth.data.m3ed import parse_m3ed_name


@dataclass(frozen=True)
class Site:
    """A place: environment family (urban / forest / indoor), style and a unique key."""

    key: str
    family: str
    style: str
    extras: tuple[str, ...] = ()


@dataclass(frozen=True)
class SequencePlan:
    """One sequence to synthesise."""

    name: str
    platform: str
    environment: str
    site: Site
    split: str
    samples: int


@dataclass(frozen=True)
class DataSizes:
    """The data half of a profile (``smoke``, ``small``, ``paper``; its simulation half is
    :data:`fedepth.bench.SIM_SIZES`): image sizes (H, W) of the M3ED RGB and event cameras and
    of NYUv2, the scale of KITTI's native size, samples per sequence (depth frames at 10 Hz for
    M3ED and KITTI drives, images for NYUv2), and how many sequences."""

    name: str
    rgb_size: tuple[int, int]
    event_size: tuple[int, int]
    nyu_size: tuple[int, int]
    kitti_scale: float
    train_samples: tuple[int, int]
    test_samples: int
    pretrain_samples: int
    hpe_train: int | None
    hpe_test: int | None
    pretrain: int
    nyu_train: int
    nyu_test: int
    nyu_clients: int
    kitti_clients: int
    kitti_test_drives: int


DATA_SIZES: dict[str, DataSizes] = {
    # CI: a handful of sequences of tiny frames, seconds to generate.
    "smoke": DataSizes(
        name="smoke",
        rgb_size=(25, 40),
        event_size=(23, 40),
        nyu_size=(24, 32),
        kitti_scale=1 / 20,
        train_samples=(5, 8),
        test_samples=4,
        pretrain_samples=4,
        hpe_train=4,
        hpe_test=2,
        pretrain=1,
        nyu_train=12,
        nyu_test=4,
        nyu_clients=3,
        kitti_clients=3,
        kitti_test_drives=1,
    ),
    # CPU benchmark: every client, 48x64 to 80x128 frames (1/10 of native), 30-90 samples each.
    "small": DataSizes(
        name="small",
        rgb_size=(80, 128),
        event_size=(72, 128),
        nyu_size=(48, 64),
        kitti_scale=1 / 10,
        train_samples=(30, 90),
        test_samples=40,
        pretrain_samples=60,
        hpe_train=None,
        hpe_test=None,
        pretrain=8,
        nyu_train=200,
        nyu_test=164,
        nyu_clients=15,
        kitti_clients=17,
        kitti_test_drives=4,
    ),
    # The paper's counts and the sensors' native sizes (hours of rendering).
    "paper": DataSizes(
        name="paper",
        rgb_size=(800, 1280),
        event_size=(720, 1280),
        nyu_size=(480, 640),
        kitti_scale=1.0,
        train_samples=(300, 3000),
        test_samples=600,
        pretrain_samples=1200,
        hpe_train=None,
        hpe_test=None,
        pretrain=24,
        nyu_train=795,
        nyu_test=654,
        nyu_clients=15,
        kitti_clients=17,
        kitti_test_drives=28,
    ),
}

_SITES = {
    "penno": Site("penno", "urban", "campus"),
    "penno_high_beams": Site("penno", "urban", "campus", ("high_beams",)),
    "center_city": Site("center_city", "urban", "downtown"),
    "rittenhouse": Site("rittenhouse", "urban", "downtown"),
    "ucity": Site("ucity", "urban", "residential"),
    "skatepark": Site("skatepark", "urban", "park"),
    "river_trail": Site("river_trail", "urban", "park"),
    "art_plaza": Site("art_plaza", "urban", "park"),
    "forest_road": Site("forest_road", "forest", "dense"),
    "forest_trail": Site("forest_trail", "forest", "dense"),
    "forest_sand": Site("forest_sand", "forest", "open"),
    "flight_arena": Site("flight_arena", "indoor", "arena"),
    "building_lobby": Site("building_lobby", "indoor", "lobby"),
    "obstacle_room": Site("obstacle_room", "indoor", "arena"),
}

#: (M3ED sequence name, site, split). Environment and platform come from the name.
HPE_SEQUENCES: tuple[tuple[str, str, str], ...] = (
    ("car_forest_sand_1", "forest_sand", "train"),
    ("car_forest_tree_tunnel", "forest_road", "train"),
    ("car_forest_into_ponds_long", "forest_sand", "train"),
    ("car_forest_into_ponds_short", "forest_sand", "test"),
    ("car_urban_day_city_hall", "center_city", "train"),
    ("car_urban_day_penno_big_loop", "penno", "train"),
    ("car_urban_day_penno_small_loop", "penno", "train"),
    ("car_urban_day_rittenhouse", "rittenhouse", "train"),
    ("car_urban_day_ucity_small_loop", "ucity", "train"),
    ("car_urban_day_horse", "center_city", "test"),
    ("car_urban_night_city_hall", "center_city", "train"),
    ("car_urban_night_penno_big_loop", "penno", "train"),
    ("car_urban_night_penno_small_loop", "penno", "train"),
    ("car_urban_night_penno_small_loop_darker", "penno", "train"),
    ("car_urban_night_ucity_small_loop", "ucity", "train"),
    ("car_urban_night_rittenhouse", "rittenhouse", "test"),
    ("falcon_forest_road_1", "forest_road", "train"),
    ("falcon_forest_road_forest", "forest_road", "train"),
    ("falcon_forest_up_down", "forest_trail", "train"),
    ("falcon_forest_into_forest_1", "forest_trail", "train"),
    ("falcon_forest_into_forest_2", "forest_trail", "train"),
    ("falcon_forest_road_2", "forest_road", "test"),
    ("falcon_indoor_flight_1", "flight_arena", "train"),
    ("falcon_indoor_flight_2", "flight_arena", "train"),
    ("falcon_indoor_flight_3", "flight_arena", "test"),
    ("falcon_outdoor_day_penno_parking_1", "penno", "train"),
    ("falcon_outdoor_day_penno_parking_2", "penno", "train"),
    ("falcon_outdoor_day_penno_cars", "penno", "train"),
    ("falcon_outdoor_day_penno_trees", "penno", "train"),
    ("falcon_outdoor_day_fast_flight_1", "penno", "train"),
    ("falcon_outdoor_day_penno_plaza", "penno", "test"),
    ("falcon_outdoor_night_penno_parking_1", "penno", "train"),
    ("falcon_outdoor_night_high_beams", "penno_high_beams", "train"),
    ("falcon_outdoor_night_penno_parking_2", "penno", "test"),
    ("spot_forest_easy_1", "forest_trail", "train"),
    ("spot_forest_easy_2", "forest_trail", "train"),
    ("spot_forest_hard", "forest_trail", "train"),
    ("spot_forest_road_1", "forest_road", "train"),
    ("spot_forest_road_3", "forest_road", "test"),
    ("spot_indoor_building_loop", "building_lobby", "train"),
    ("spot_indoor_stairs", "building_lobby", "train"),
    ("spot_indoor_stairwell", "building_lobby", "train"),
    ("spot_indoor_obstacles", "obstacle_room", "test"),
    ("spot_outdoor_day_art_plaza_loop", "art_plaza", "train"),
    ("spot_outdoor_day_srt_green_loop", "river_trail", "train"),
    ("spot_outdoor_day_skatepark_1", "skatepark", "train"),
    ("spot_outdoor_day_rocky_steps", "river_trail", "train"),
    ("spot_outdoor_day_srt_under_bridge_1", "river_trail", "train"),
    ("spot_outdoor_day_penno_short_loop", "penno", "train"),
    ("spot_outdoor_day_skatepark_2", "skatepark", "test"),
    ("spot_outdoor_night_penno_plaza_lights", "penno", "train"),
    ("spot_outdoor_night_penno_short_loop", "penno", "test"),
)
#: M3ED sequences with depth not used (one per largest combination), to reach 41 clients.
HPE_UNUSED = (
    "falcon_forest_into_forest_4",
    "falcon_outdoor_day_fast_flight_2",
    "spot_outdoor_day_srt_under_bridge_2",
)
#: Smoke profile: four training clients over four environments and three platforms, two tests.
SMOKE_TRAIN = (
    "car_urban_day_penno_small_loop",
    "spot_forest_easy_1",
    "falcon_indoor_flight_1",
    "car_urban_night_penno_big_loop",
)
SMOKE_TEST = ("spot_outdoor_day_skatepark_2", "falcon_forest_road_2")

#: Pretraining places and platforms: every environment, all four platforms, unseen places.
PRETRAIN = (
    ("handheld", "urban_day", Site("pre_residential", "urban", "residential")),
    ("car", "urban_day", Site("pre_highway", "urban", "highway")),
    ("spot", "forest", Site("pre_open_forest", "forest", "open")),
    ("falcon", "urban_day", Site("pre_park", "urban", "park")),
    ("handheld", "indoor", Site("pre_office", "indoor", "office")),
    ("spot", "indoor", Site("pre_store", "indoor", "store")),
    ("car", "urban_night", Site("pre_downtown", "urban", "downtown")),
    ("handheld", "forest", Site("pre_dense_forest", "forest", "dense")),
)

#: NYUv2 labeled-set scene types (approximate image counts: bedroom 383, kitchen 225, living
#: room 221, bathroom 121, dining room 117, office and home office ~130, classroom 49,
#: bookstore/stores ~40) and the 15 clients they are split into.
NYU_CLIENT_TYPES = (
    "bedroom",
    "bedroom",
    "bedroom",
    "bedroom",
    "kitchen",
    "kitchen",
    "living_room",
    "living_room",
    "bathroom",
    "bathroom",
    "dining_room",
    "office",
    "office",
    "classroom",
    "store",
)
NYU_TEST_TYPES = (
    "bedroom",
    "kitchen",
    "living_room",
    "bathroom",
    "dining_room",
    "office",
    "classroom",
    "store",
)
#: KITTI drive styles: the Eigen split's drives are residential, city and road scenes.
KITTI_STYLES = (
    "residential",
    "downtown",
    "highway",
    "residential",
    "campus",
    "downtown",
    "residential",
    "highway",
)


def stable_seed(*parts: object) -> int:
    """A seed that depends only on its arguments (Python's hash() is salted per process)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def _samples(profile: DataSizes, split: str, name: str, seed: int) -> int:
    if split == "test":
        return profile.test_samples
    if split == "pretrain":
        return profile.pretrain_samples
    lo, hi = profile.train_samples
    # M3ED sequences last from under a minute to ~10 minutes: log-uniform sample counts.
    rng = np.random.default_rng(stable_seed(seed, "samples", name))
    return round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))))


def hpe_plan(profile: DataSizes, seed: int) -> list[SequencePlan]:
    """The HPE sequences of a profile (training clients, test sequences, pretraining)."""
    rows = HPE_SEQUENCES
    if profile.hpe_train is not None:
        keep = set(SMOKE_TRAIN[: profile.hpe_train]) | set(SMOKE_TEST[: profile.hpe_test or 0])
        rows = tuple(r for r in rows if r[0] in keep)
    plans = []
    for name, site, split in rows:
        platform, env = parse_m3ed_name(name)
        plans.append(
            SequencePlan(
                name, platform, env, _SITES[site], split, _samples(profile, split, name, seed)
            )
        )
    return plans + pretrain_plan(profile, seed)


def pretrain_plan(profile: DataSizes, seed: int) -> list[SequencePlan]:
    plans = []
    for k in range(profile.pretrain):
        platform, env, site = PRETRAIN[k % len(PRETRAIN)]
        rnd = k // len(PRETRAIN)
        s = Site(f"{site.key}_{rnd}", site.family, site.style)
        name = f"pretrain_{platform}_{env}_{k:02d}"
        plans.append(
            SequencePlan(
                name, platform, env, s, "pretrain", _samples(profile, "pretrain", name, seed)
            )
        )
    return plans
