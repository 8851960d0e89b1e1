"""Procedural worlds of the four environments: urban streets, forest trails and indoor rooms.

Each builder makes a :class:`~fedepth.data.synth.world.World` from a seeded generator. Sizes
and densities model the places the datasets were recorded in, and each style's parameters say
which real place they stand for:

- urban: carriageway and sidewalk widths, building heights, frontages and setbacks of a dense
  downtown (Philadelphia's Center City in M3ED, KITTI's "city"), an industrial campus with
  parking lots (M3ED's Pennovation sequences), a residential street (KITTI "residential",
  University City), a highway (M3ED's Schuylkill expressway, KITTI "road") and a park path
  (M3ED's skatepark, river trail and art plaza);
- forest: a dense deciduous forest crossed by a 3 m dirt trail (Wissahickon-like, ~600
  trees/ha, trunk diameters 20-70 cm, 10-22 m tall) and an open forest clearing with a sand track
  and ponds;
- indoor: rooms of NYUv2's most frequent scene types and M3ED's indoor places (a lobby, a
  flight arena with obstacles), every dimension chosen so no point is 10 m or more from any
  camera inside the room (NYUv2's depth range).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedepth.data.synth.world import (
    Lane,
    Lights,
    Path,
    Terrain,
    World,
    WorldBuilder,
    meander,
)

F64 = npt.NDArray[np.float64]

#: Car body colours (albedo tints of a 0.5 base): white, black, greys and silver dominate fleets.
CAR_TINTS = np.array(
    [
        [1.5, 1.5, 1.5],
        [0.12, 0.12, 0.13],
        [0.7, 0.7, 0.72],
        [1.1, 1.1, 1.15],
        [1.2, 0.25, 0.2],
        [0.25, 0.35, 0.9],
        [0.4, 0.45, 0.4],
    ]
)
#: Interior wall paints (tints of a 0.75 white): white, beige, pale blue, pale green, grey.
WALL_TINTS = np.array(
    [[1.0, 1.0, 1.0], [1.0, 0.93, 0.8], [0.85, 0.92, 1.05], [0.9, 1.0, 0.88], [0.8, 0.8, 0.8]]
)
#: Distance trajectories keep from the ends of a route, so views (up to ~100 m) stay in the world.
URBAN_MARGIN = 110.0
FOREST_MARGIN = 70.0
SODIUM = (1.0, 0.7, 0.4)
LED = (1.0, 0.96, 0.9)
WARM = (1.0, 0.88, 0.72)


@dataclass(frozen=True)
class UrbanStyle:
    """Street cross-section and frontage of one kind of urban place (lengths in metres).

    ``road``: carriageway width (~3-3.5 m per lane); ``sidewalk``: width of each sidewalk;
    ``setback``, ``height``, ``frontage``, ``depth``: building distance behind the sidewalk,
    height, length along the street and depth; ``gap`` / ``gap_prob``: alleys or open lots
    between buildings and how often they occur; ``parked``: share of kerb slots (6.5 m) holding a
    parked car; ``trees``: share of 10 m sidewalk slots with a street tree (open styles: tree
    density over the lawns); ``lamp_spacing``: street-lamp spacing on each side (staggered);
    ``curviness``: heading amplitude of the route (0 = straight grid street); ``lots``: parking
    lots with rows of cars in the setback; ``roofs``: gable roofs (houses); ``guardrail`` and
    ``hills`` for highways; ``lamp_color``: sodium (orange) or LED (white) lamps.
    """

    road: float
    sidewalk: float
    setback: tuple[float, float]
    height: tuple[float, float]
    frontage: tuple[float, float]
    depth: tuple[float, float]
    gap: tuple[float, float]
    gap_prob: float
    parked: float
    trees: float
    lamp_spacing: float
    curviness: float
    facades: tuple[str, ...]
    ground: str = "concrete"
    paved: str = "asphalt"
    lots: bool = False
    roofs: bool = False
    guardrail: bool = False
    hills: bool = False
    lamp_color: tuple[float, float, float] = SODIUM


URBAN_STYLES: dict[str, UrbanStyle] = {
    # Center City: 2 x 2 lanes (~12 m), 4 m sidewalks, 12-60 m buildings without setback.
    "downtown": UrbanStyle(
        road=12.0,
        sidewalk=4.0,
        setback=(0.0, 1.0),
        height=(12.0, 60.0),
        frontage=(10.0, 35.0),
        depth=(12.0, 25.0),
        gap=(4.0, 8.0),
        gap_prob=0.15,
        parked=0.6,
        trees=0.25,
        lamp_spacing=30.0,
        curviness=0.0,
        facades=("brick", "facade", "glass_facade"),
    ),
    # Industrial campus: narrow roads, low 5-15 m buildings behind 8-30 m of parking lot.
    "campus": UrbanStyle(
        road=8.0,
        sidewalk=3.0,
        setback=(8.0, 30.0),
        height=(5.0, 15.0),
        frontage=(20.0, 60.0),
        depth=(15.0, 40.0),
        gap=(10.0, 30.0),
        gap_prob=0.3,
        parked=0.4,
        trees=0.4,
        lamp_spacing=25.0,
        curviness=0.15,
        facades=("brick", "facade"),
        ground="grass",
        lots=True,
        lamp_color=LED,
    ),
    # Residential street: 5-8 m houses with gable roofs behind 3-8 m front yards.
    "residential": UrbanStyle(
        road=9.0,
        sidewalk=2.5,
        setback=(3.0, 8.0),
        height=(5.0, 8.0),
        frontage=(8.0, 15.0),
        depth=(8.0, 12.0),
        gap=(2.0, 6.0),
        gap_prob=0.7,
        parked=0.5,
        trees=0.6,
        lamp_spacing=35.0,
        curviness=0.1,
        facades=("facade", "brick"),
        ground="grass",
        roofs=True,
    ),
    # Highway: 4 lanes (~16 m), guardrails, vegetation and buildings 30-80 m away, hills.
    "highway": UrbanStyle(
        road=16.0,
        sidewalk=0.0,
        setback=(30.0, 80.0),
        height=(8.0, 25.0),
        frontage=(20.0, 60.0),
        depth=(15.0, 30.0),
        gap=(20.0, 80.0),
        gap_prob=0.6,
        parked=0.0,
        trees=0.8,
        lamp_spacing=50.0,
        curviness=0.25,
        facades=("facade", "brick"),
        ground="grass",
        guardrail=True,
        hills=True,
    ),
    # Park path: a 4 m paved path through lawns and trees, buildings 35-80 m away.
    "park": UrbanStyle(
        road=4.0,
        sidewalk=0.0,
        setback=(35.0, 80.0),
        height=(8.0, 30.0),
        frontage=(15.0, 50.0),
        depth=(12.0, 30.0),
        gap=(10.0, 40.0),
        gap_prob=0.5,
        parked=0.0,
        trees=0.8,
        lamp_spacing=20.0,
        curviness=0.35,
        facades=("brick", "facade"),
        ground="grass",
        paved="concrete",
        lamp_color=LED,
    ),
}


def _strip_points(path: Path, s: F64, lateral: float, z: float) -> F64:
    xy = path.offset(s, np.full_like(s, lateral))
    return np.concatenate([xy, np.full((s.size, 1), z)], 1)


def _car(b: WorldBuilder, xy: F64, yaw: F64, rng: np.random.Generator) -> None:
    """Passenger cars: ~4.4 x 1.8 m body on its wheels, ~1.5 m tall with the cabin."""
    n = int(xy.shape[0])
    if n == 0:
        return
    base = np.concatenate([xy, np.zeros((n, 1))], 1)
    tint = CAR_TINTS[rng.integers(0, len(CAR_TINTS), n)]
    length = rng.uniform(4.0, 4.9, n)
    b.add(
        "box",
        "asphalt",
        base,
        np.stack([length - 0.4, np.full(n, 1.6), np.full(n, 0.3)], 1),
        yaw,
        tint=np.full((n, 3), 0.4),
    )
    b.add(
        "box",
        "car_paint",
        base + np.array([0.0, 0.0, 0.3]),
        np.stack([length, np.full(n, 1.8), np.full(n, 0.65)], 1),
        yaw,
        tint,
    )
    fwd = np.stack([np.cos(yaw), np.sin(yaw)], 1) * -0.2
    cab = base + np.concatenate([fwd, np.full((n, 1), 0.95)], 1)
    b.add(
        "box",
        "car_glass",
        cab,
        np.stack([length * 0.55, np.full(n, 1.6), rng.uniform(0.45, 0.6, n)], 1),
        yaw,
    )


def _tree(
    b: WorldBuilder,
    base: F64,
    trunk_r: F64,
    height: F64,
    crown_r: F64,
    conifer: npt.NDArray[np.bool_],
) -> None:
    """Trunks (cylinders) with a deciduous (squashed sphere) or conifer (cone) crown."""
    n = base.shape[0]
    if n == 0:
        return
    b.add("cylinder", "bark", base, np.stack([trunk_r, trunk_r, height], 1))
    dec = ~conifer
    if dec.any():
        c = base[dec] + np.stack(
            [np.zeros(dec.sum()), np.zeros(dec.sum()), height[dec] - 0.6 * crown_r[dec]], 1
        )
        r = crown_r[dec]
        b.add("sphere", "foliage", c, np.stack([r, r, 0.8 * r], 1))
    if conifer.any():
        c = base[conifer] + np.stack(
            [np.zeros(conifer.sum()), np.zeros(conifer.sum()), 0.3 * height[conifer]], 1
        )
        r = crown_r[conifer]
        b.add(
            "cone",
            "foliage",
            c,
            np.stack([r, r, 0.75 * height[conifer]], 1),
            tint=np.tile([0.8, 0.9, 0.8], (conifer.sum(), 1)),
        )


def urban(
    rng: np.random.Generator, style: str, length: float, extras: tuple[str, ...] = ()
) -> World:
    """A street of ``length`` metres in the given :data:`URBAN_STYLES` style."""
    st = URBAN_STYLES[style]
    path = Path(meander(rng, length, st.curviness))
    b = WorldBuilder()
    s = np.arange(0.0, path.length + 1.0, 1.0)
    lo, hi = path.xy.min(0) - 250.0, path.xy.max(0) + 250.0
    b.add_mesh(
        [[lo[0], lo[1], 0], [hi[0], lo[1], 0], [hi[0], hi[1], 0], [lo[0], hi[1], 0]],
        [[0, 1, 2], [0, 2, 3]],
        st.ground,
    )
    half = st.road / 2
    b.add_strip(_strip_points(path, s, half, 0.02), _strip_points(path, s, -half, 0.02), st.paved)
    for side in (1.0, -1.0):
        if st.sidewalk > 0:
            edge, outer = side * half, side * (half + st.sidewalk)
            b.add_strip(
                _strip_points(path, s, edge, 0.02), _strip_points(path, s, edge, 0.15), "concrete"
            )
            b.add_strip(
                _strip_points(path, s, edge, 0.15), _strip_points(path, s, outer, 0.15), "concrete"
            )
        if st.paved == "asphalt":
            b.add_strip(
                _strip_points(path, s, side * (half - 0.3), 0.03),
                _strip_points(path, s, side * (half - 0.42), 0.03),
                "lane_paint",
            )
        if st.guardrail:
            b.add_strip(
                _strip_points(path, s, side * (half + 1.0), 0.45),
                _strip_points(path, s, side * (half + 1.0), 0.8),
                "metal",
            )
    if st.paved == "asphalt" and st.road >= 8:
        ds = np.arange(2.0, path.length, 9.0)
        b.add(
            "box",
            "lane_paint",
            np.concatenate([path.point(ds), np.full((ds.size, 1), 0.02)], 1),
            (3.0, 0.15, 0.015),
            path.heading(ds),
        )
    curb = half + st.sidewalk
    for side in (1.0, -1.0):
        # buildings
        pos = float(rng.uniform(0, 10))
        centers, sizes, yaws, mats = [], [], [], []
        while pos < path.length:
            f = rng.uniform(*st.frontage)
            dep = rng.uniform(*st.depth)
            setback = rng.uniform(*st.setback)
            mid = pos + f / 2
            offset = side * (curb + setback + dep / 2)
            centers.append([*path.offset(mid, offset), 0.0])
            sizes.append([f, dep, rng.uniform(*st.height)])
            yaws.append(float(path.heading(mid)))
            mats.append(st.facades[rng.integers(len(st.facades))])
            if st.lots and setback > 9:
                rows = np.arange(curb + 3.0, curb + setback - 3.0, 5.5)
                for r in rows:
                    slots = np.arange(pos + 1.5, pos + f - 1.5, 2.7)
                    keep = slots[rng.random(slots.size) < 0.6]
                    _car(
                        b,
                        path.offset(keep, np.full(keep.size, side * r)),
                        path.heading(keep) + np.pi / 2,
                        rng,
                    )
            pos += f + (rng.uniform(*st.gap) if rng.random() < st.gap_prob else 0.3)
        C, S, Y = np.array(centers), np.array(sizes), np.array(yaws)
        tints = rng.uniform(0.8, 1.2, (len(mats), 1)) * rng.uniform(0.92, 1.08, (len(mats), 3))
        for m in set(mats):
            sel = np.array([x == m for x in mats])
            b.add("box", m, C[sel], S[sel], Y[sel], tints[sel])
        b.add(
            "box",
            "roof",
            C + np.stack([np.zeros(len(C)), np.zeros(len(C)), S[:, 2]], 1),
            S * [1.0, 1.0, 0.0] + [0.0, 0.0, 0.05],
            Y,
        )
        if st.roofs:
            roof_c = C + np.stack([np.zeros(len(C)), np.zeros(len(C)), S[:, 2]], 1)
            b.add(
                "prism",
                "roof",
                roof_c,
                np.stack([S[:, 0], S[:, 1], S[:, 1] * 0.35], 1),
                Y,
                tint=np.tile([1.3, 0.7, 0.6], (len(C), 1)),
            )
        # parked cars along the curb
        if st.parked > 0:
            slots = np.arange(3.0, path.length - 3.0, 6.5)
            keep = slots[rng.random(slots.size) < st.parked]
            _car(
                b,
                path.offset(keep, np.full(keep.size, side * (half - 1.1))),
                path.heading(keep) + (0.0 if side < 0 else np.pi),
                rng,
            )
        # trees: on the sidewalk, or scattered over the lawns of open styles
        if st.sidewalk > 0:
            ts = np.arange(5.0, path.length, 10.0)
            ts = ts[rng.random(ts.size) < st.trees]
            lat = np.full(ts.size, side * (curb - 0.5))
        else:
            n = int(st.trees * path.length / 8.0)
            ts = rng.uniform(0, path.length, n)
            lat = side * rng.uniform(half + 3.0, half + 40.0, n)
        xy = path.offset(ts, lat)
        n = ts.size
        _tree(
            b,
            np.concatenate([xy, np.zeros((n, 1))], 1),
            rng.uniform(0.12, 0.3, n),
            rng.uniform(5.0, 12.0, n),
            rng.uniform(1.8, 3.5, n),
            rng.random(n) < 0.15,
        )
        # street lamps: 8 m poles at the kerb with the head over the road, alternating sides
        ls = np.arange(rng.uniform(0, st.lamp_spacing), path.length, st.lamp_spacing * 2)
        if side < 0:
            ls = ls + st.lamp_spacing
        ls = ls[ls < path.length]
        pole_xy = path.offset(ls, np.full(ls.size, side * (curb + 0.4 if curb > 0 else half + 1)))
        head_xy = path.offset(ls, np.full(ls.size, side * (half - 0.8)))
        n = ls.size
        b.add(
            "cylinder", "metal", np.concatenate([pole_xy, np.zeros((n, 1))], 1), (0.09, 0.09, 8.0)
        )
        b.add(
            "box",
            "lamp_head",
            np.concatenate([head_xy, np.full((n, 1), 7.8)], 1),
            (0.7, 0.35, 0.15),
            path.heading(ls),
        )
        if n:
            b.add_lights(
                Lights.make(
                    np.concatenate([head_xy, np.full((n, 1), 7.7)], 1),
                    0.012,
                    st.lamp_color,
                    (0, 0, -1),
                    1.2,
                )
            )
    if st.hills:
        n = 10
        hs = rng.uniform(0, path.length, n)
        lat = rng.choice([-1.0, 1.0], n) * rng.uniform(90.0, 200.0, n)
        r = rng.uniform(25.0, 60.0, n)
        c = np.concatenate([path.offset(hs, lat), np.full((n, 1), 0.0)], 1)
        b.add("sphere", "grass", c, np.stack([r * 1.5, r, r * 0.35], 1))
    if "high_beams" in extras:
        # a parked car facing the route with its high beams on (~100 kcd: ~2 in these units)
        sc = path.length / 2
        xy = path.offset(np.array([sc]), np.array([half - 1.1]))
        yaw = float(path.heading(sc)) + np.pi
        _car(b, xy, np.array([yaw]), rng)
        ax = (np.cos(yaw), np.sin(yaw), -0.03)
        for d in (-0.7, 0.7):
            p = path.offset(np.array([sc - 2.0]), np.array([half - 1.1 + d]))
            b.add_lights(Lights.make([[p[0, 0], p[0, 1], 0.7]], 2.0, WARM, ax, 0.12))
    # Right-hand traffic: the car keeps to the middle of the right half of the lanes left free
    # by parked cars (~2 m each side); walkers keep to the inner 40 % of the sidewalk.
    free = half - 2.0 if st.parked > 0 else half
    lanes = {
        "car": Lane(-free / 2),
        "falcon": Lane(0.0),
        "default": Lane(-(half + 0.4 * st.sidewalk), 0.15)
        if st.sidewalk > 0
        else Lane(-(half + 1.5) if st.paved == "asphalt" else -0.6),
    }
    return b.build(path, "outdoor", lanes, margin=URBAN_MARGIN)


@dataclass(frozen=True)
class ForestStyle:
    """A forest: ``trail`` width (m); ``trees``, ``bushes``, ``logs``: densities per m^2 (600
    stems/ha = 0.06); ``relief``: terrain height amplitude (m); ``conifer``: share of conifers;
    ``trunk_radius`` and ``tree_height`` ranges (m); ground and trail materials; ``ponds``: how
    many; ``curviness``: heading amplitude of the trail (rad); ``band``: half-width (m) of the
    forested strip around the trail."""

    trail: float
    trees: float
    bushes: float
    logs: float
    relief: float
    conifer: float
    trunk_radius: tuple[float, float]
    tree_height: tuple[float, float]
    ground: str
    trail_material: str
    ponds: int
    curviness: float
    band: float


FOREST_STYLES: dict[str, ForestStyle] = {
    # Dense deciduous forest (~600 stems/ha), thick understory, 3 m dirt trail, rolling relief.
    "dense": ForestStyle(
        trail=3.0,
        trees=0.06,
        bushes=0.05,
        logs=0.004,
        relief=0.8,
        conifer=0.2,
        trunk_radius=(0.1, 0.35),
        tree_height=(10.0, 22.0),
        ground="litter",
        trail_material="dirt",
        ponds=0,
        curviness=0.35,
        band=40.0,
    ),
    # Open forest clearing (~120 stems/ha), sand track, grass and a few ponds.
    "open": ForestStyle(
        trail=5.0,
        trees=0.012,
        bushes=0.02,
        logs=0.001,
        relief=0.4,
        conifer=0.1,
        trunk_radius=(0.12, 0.4),
        tree_height=(8.0, 20.0),
        ground="grass",
        trail_material="sand",
        ponds=3,
        curviness=0.25,
        band=60.0,
    ),
}


def forest(rng: np.random.Generator, style: str, length: float) -> World:
    """A trail of ``length`` metres through forest of the given :data:`FOREST_STYLES` style."""
    st = FOREST_STYLES[style]
    path = Path(meander(rng, length, st.curviness))
    terrain = Terrain(rng, st.relief, path, st.trail / 2 + 0.5)
    b = WorldBuilder()
    lo, hi = path.xy.min(0) - st.band - 20, path.xy.max(0) + st.band + 20
    x = np.arange(lo[0], hi[0] + 2.0, 2.0)
    y = np.arange(lo[1], hi[1] + 2.0, 2.0)
    X, Y = np.meshgrid(x, y)
    Z = terrain.height(np.stack([X, Y], -1))
    nx = x.size
    r, c = np.mgrid[0 : y.size - 1, 0 : nx - 1]
    cx = (x[c] + 1.0).ravel()
    cy = (y[r] + 1.0).ravel()
    centroid = np.stack([np.concatenate([cx, cx]), np.concatenate([cy, cy])], 1)
    dist = terrain.distance_to_path(centroid)
    face_mat = np.where(dist < st.trail / 2, 1, 0)
    b.add_heightfield(x, y, Z, [st.ground, st.trail_material], face_mat)
    area = path.length * 2 * st.band

    def scatter(density: float, clear: float, band: float) -> tuple[F64, F64]:
        n = int(density * area)
        s = rng.uniform(0, path.length, n)
        lat = rng.choice([-1.0, 1.0], n) * rng.uniform(clear, band, n)
        xy = path.offset(s, lat)
        keep = terrain.distance_to_path(xy) > clear
        return xy[keep], np.abs(lat[keep])

    xy, lat = scatter(st.trees, st.trail / 2 + 1.0, st.band)
    n = int(xy.shape[0])
    base = np.concatenate([xy, terrain.height(xy)[:, None] - 0.2], 1)
    crown = np.minimum(rng.uniform(2.0, 4.0, n), np.maximum(lat - 0.8, 0.5))
    _tree(
        b,
        base,
        rng.uniform(st.trunk_radius[0], st.trunk_radius[1], n),
        rng.uniform(st.tree_height[0], st.tree_height[1], n),
        crown,
        np.asarray(rng.random(n) < st.conifer),
    )
    xy, lat = scatter(st.bushes, st.trail / 2 + 0.3, st.band)
    n = int(xy.shape[0])
    rad = np.minimum(rng.uniform(0.4, 1.2, n), np.maximum(lat - st.trail / 2, 0.2))
    b.add(
        "sphere",
        "foliage",
        np.concatenate([xy, terrain.height(xy)[:, None] + 0.2 * rad[:, None]], 1),
        np.stack([rad, rad, 0.6 * rad], 1),
        tint=rng.uniform(0.8, 1.3, (n, 1)) * [1.1, 1.0, 0.9],
    )
    # fallen logs lie roughly along the trail (never across it)
    n = int(st.logs * area)
    ls = rng.uniform(0, path.length, n)
    xy = path.offset(ls, rng.choice([-1.0, 1.0], n) * rng.uniform(st.trail / 2 + 1.5, st.band, n))
    rad = rng.uniform(0.12, 0.3, n)
    b.add(
        "cylinder",
        "bark",
        np.concatenate([xy, terrain.height(xy)[:, None] + rad[:, None]], 1),
        np.stack([rad, rad, rng.uniform(3.0, 8.0, n)], 1),
        path.heading(ls) + np.pi / 2 + rng.uniform(-0.3, 0.3, n),
        tilt=np.full(n, np.pi / 2),
    )
    xy, _ = scatter(0.002, st.trail / 2 + 0.5, st.band)
    n = int(xy.shape[0])
    rad = rng.uniform(0.3, 1.0, n)
    b.add(
        "sphere",
        "rock",
        np.concatenate([xy, terrain.height(xy)[:, None]], 1),
        np.stack([rad, rad * 0.8, rad * 0.6], 1),
    )
    for _ in range(st.ponds):
        ps = rng.uniform(0, path.length)
        pond_r = float(rng.uniform(4.0, 10.0))
        side = float(rng.choice([-1.0, 1.0]))
        cxy = path.offset(ps, side * (st.trail / 2 + pond_r + rng.uniform(2, 15)))
        zc = float(terrain.height(cxy[None])[0]) + 0.05
        b.add("cylinder", "water", [cxy[0], cxy[1], zc - 0.5], (pond_r, pond_r * 0.7, 0.52))
    lanes = {"default": Lane(0.0)}
    return b.build(path, "outdoor", lanes, margin=FOREST_MARGIN, ground=terrain)


# ---------------------------------------------------------------------------------------------
# indoor


@dataclass(frozen=True)
class RoomStyle:
    """Room size ranges (m), floor material, window and ceiling-lamp counts."""

    width: tuple[float, float]
    depth: tuple[float, float]
    height: tuple[float, float]
    floor: str
    windows: int
    lamps: int


ROOM_STYLES: dict[str, RoomStyle] = {
    "bedroom": RoomStyle(
        width=(3.2, 5.0),
        depth=(3.5, 5.0),
        height=(2.4, 2.8),
        floor="floor_wood",
        windows=1,
        lamps=1,
    ),
    "kitchen": RoomStyle(
        width=(3.0, 5.0),
        depth=(3.2, 6.0),
        height=(2.4, 2.8),
        floor="floor_tile",
        windows=1,
        lamps=2,
    ),
    "living_room": RoomStyle(
        width=(4.0, 7.0),
        depth=(4.0, 6.5),
        height=(2.4, 3.0),
        floor="floor_wood",
        windows=2,
        lamps=2,
    ),
    "bathroom": RoomStyle(
        width=(2.4, 3.2),
        depth=(2.6, 3.6),
        height=(2.3, 2.6),
        floor="floor_tile",
        windows=0,
        lamps=1,
    ),
    "dining_room": RoomStyle(
        width=(3.5, 5.0),
        depth=(3.5, 5.5),
        height=(2.4, 3.0),
        floor="floor_wood",
        windows=1,
        lamps=1,
    ),
    "office": RoomStyle(
        width=(3.5, 7.0), depth=(3.5, 6.0), height=(2.6, 3.0), floor="carpet", windows=2, lamps=3
    ),
    "classroom": RoomStyle(
        width=(6.0, 7.5), depth=(6.0, 7.0), height=(2.8, 3.2), floor="carpet", windows=2, lamps=4
    ),
    "store": RoomStyle(
        width=(6.0, 8.0),
        depth=(5.0, 6.5),
        height=(3.0, 3.4),
        floor="floor_tile",
        windows=0,
        lamps=4,
    ),
    # M3ED indoor places: a building lobby (Spot) and a flight arena with obstacles (Falcon).
    "lobby": RoomStyle(
        width=(6.0, 8.0), depth=(5.0, 6.5), height=(3.0, 3.4), floor="concrete", windows=2, lamps=4
    ),
    "arena": RoomStyle(
        width=(6.0, 8.0), depth=(5.5, 6.5), height=(3.0, 3.4), floor="concrete", windows=0, lamps=4
    ),
}


class _Room:
    """Furniture placement that keeps the robot's loop free.

    The loop is an ellipse ``clearance`` metres inside the walls. An item taller than
    ``low_ok`` (lowest camera height minus a margin) must stay ``band`` metres away from the
    loop; lower items (beds, tables) may stand under it, since the camera passes above them.
    Items do not overlap; tabletops are remembered to put small objects on.
    """

    def __init__(
        self,
        b: WorldBuilder,
        rng: np.random.Generator,
        w: float,
        d: float,
        h: float,
        clearance: float,
        low_ok: float,
        band: float = 0.45,
    ) -> None:
        self.b, self.rng, self.w, self.d, self.h = b, rng, w, d, h
        th = np.linspace(0, 2 * np.pi, 120, endpoint=False)
        self.ring = np.stack(
            [(w / 2 - clearance) * np.cos(th), (d / 2 - clearance) * np.sin(th)], 1
        )
        self.low_ok = low_ok
        self.band = band
        self.boxes: list[tuple[float, float, float, float]] = []
        self.tops: list[tuple[float, float, float, float, float]] = []

    def free(self, cx: float, cy: float, hx: float, hy: float, height: float) -> bool:
        if abs(cx) + hx > self.w / 2 - 0.02 or abs(cy) + hy > self.d / 2 - 0.02:
            return False
        for bx, by, bhx, bhy in self.boxes:
            if abs(cx - bx) < hx + bhx + 0.05 and abs(cy - by) < hy + bhy + 0.05:
                return False
        if height > self.low_ok:
            dx = np.maximum(np.abs(self.ring[:, 0] - cx) - hx, 0.0)
            dy = np.maximum(np.abs(self.ring[:, 1] - cy) - hy, 0.0)
            if float(np.hypot(dx, dy).min()) < self.band:
                return False
        return True

    def place(
        self,
        size: tuple[float, float, float],
        material: str,
        *,
        wall: bool = True,
        tint: npt.ArrayLike | None = None,
        z: float = 0.0,
        top: bool = False,
        tries: int = 40,
    ) -> tuple[float, float, float] | None:
        """Place a (length, depth, height) box with its back to a wall (``wall``) or free
        standing; returns (x, y, yaw) or None when it does not fit anywhere."""
        length, depth, height = size
        for _ in range(tries):
            if wall:
                k = int(self.rng.integers(4))
                span = (self.w if k % 2 == 0 else self.d) / 2 - length / 2 - 0.05
                if span <= 0:
                    continue
                t = float(self.rng.uniform(-span, span))
                yaw = k * np.pi / 2
                n = (np.sin(yaw), -np.cos(yaw))  # outward wall normal of wall k
                reach = (self.d if k % 2 == 0 else self.w) / 2 - depth / 2
                cx = float(n[0] * reach + np.cos(yaw) * t)
                cy = float(n[1] * reach + np.sin(yaw) * t)
            else:
                yaw = float(self.rng.choice([0.0, np.pi / 2]))
                cx = float(self.rng.uniform(-self.w / 2, self.w / 2))
                cy = float(self.rng.uniform(-self.d / 2, self.d / 2))
            quarter = round(yaw / (np.pi / 2)) % 2
            hx, hy = (length / 2, depth / 2) if quarter == 0 else (depth / 2, length / 2)
            if z > 0 or self.free(cx, cy, hx, hy, z + height):
                if z == 0:
                    self.boxes.append((cx, cy, hx, hy))
                self.b.add("box", material, [cx, cy, z], (length, depth, height), yaw, tint)
                if top:
                    self.tops.append((cx, cy, hx, hy, z + height))
                return cx, cy, yaw
        return None

    def clutter(self, n: int) -> None:
        """Small objects (books, boxes, vases, lamps) on remembered tabletops."""
        rng = self.rng
        for _ in range(n):
            if not self.tops:
                return
            cx, cy, hx, hy, z = self.tops[int(rng.integers(len(self.tops)))]
            size = rng.uniform(0.08, 0.35, 3)
            px = cx + float(rng.uniform(-1, 1)) * max(hx - size[0] / 2, 0.0)
            py = cy + float(rng.uniform(-1, 1)) * max(hy - size[1] / 2, 0.0)
            kind = "cylinder" if rng.random() < 0.3 else "box"
            scale = (size[0] / 2, size[0] / 2, size[2]) if kind == "cylinder" else tuple(size)
            self.b.add(
                kind,
                "fabric",
                [px, py, z],
                scale,
                float(rng.uniform(0, np.pi)),
                rng.uniform(0.3, 2.2, 3),
            )


def _chairs(room: _Room, n: int, tint: npt.ArrayLike) -> None:
    for _ in range(n):
        room.place((0.45, 0.45, 0.45), "wood", wall=False, tint=tint, tries=15)


def _shelves(room: _Room, n: int, height: float = 1.9) -> None:
    """Bookshelves with rows of coloured book spines."""
    rng = room.rng
    for _ in range(n):
        length = float(rng.uniform(0.8, 1.6))
        frame = room.place((length, 0.35, height), "wood", tint=rng.uniform(0.7, 1.4, 3))
        if frame is None:
            continue
        cx, cy, yaw = frame
        c, s = np.cos(yaw), np.sin(yaw)
        along = np.linspace(-length / 2 + 0.06, length / 2 - 0.06, int(length / 0.09))
        for k in range(int(height / 0.4)):
            keep = along[rng.random(along.size) < 0.8]
            pts = np.stack(
                [
                    cx + c * keep + s * 0.03,
                    cy + s * keep - c * 0.03,
                    np.full(keep.size, 0.05 + 0.4 * k),
                ],
                1,
            )
            room.b.add(
                "box",
                "fabric",
                pts,
                np.stack(
                    [
                        np.full(keep.size, 0.07),
                        np.full(keep.size, 0.33),
                        rng.uniform(0.18, 0.32, keep.size),
                    ],
                    1,
                ),
                yaw,
                rng.uniform(0.3, 2.2, (keep.size, 3)),
            )


def _furnish(room: _Room, style: str) -> None:
    """Furniture of each room type (sizes of common furniture, metres)."""
    rng = room.rng
    wood = rng.uniform(0.7, 1.4, 3)
    fabric = rng.uniform(0.4, 1.8, 3)
    white = rng.uniform(0.85, 1.05, 3)
    if style == "bedroom":
        room.place((2.0, 1.6, 0.55), "fabric", tint=fabric)
        room.place((0.5, 0.4, 0.55), "wood", tint=wood, top=True)
        room.place((0.5, 0.4, 0.55), "wood", tint=wood, top=True)
        room.place((1.2, 0.6, 2.0), "wood", tint=wood)
        room.place((1.0, 0.5, 0.8), "white_furniture", tint=white, top=True)
        room.place((1.2, 0.6, 0.75), "wood", tint=wood, top=True)
        _chairs(room, 1, wood)
    elif style == "kitchen":
        for _ in range(3):
            room.place(
                (float(rng.uniform(1.2, 2.4)), 0.6, 0.9), "white_furniture", tint=white, top=True
            )
        room.place((0.7, 0.7, 1.8), "white_furniture")
        room.place((1.2, 0.8, 0.75), "wood", wall=False, tint=wood, top=True)
        _chairs(room, 3, wood)
    elif style == "living_room":
        room.place((2.0, 0.9, 0.85), "fabric", tint=fabric)
        room.place((0.9, 0.9, 0.85), "fabric", tint=fabric)
        room.place((1.0, 0.6, 0.45), "wood", wall=False, tint=wood, top=True)
        frame = room.place((1.6, 0.45, 0.5), "wood", tint=wood)
        if frame is not None:
            cx, cy, yaw = frame
            room.b.add("box", "screen", [cx, cy, 0.5], (1.2, 0.08, 0.7), yaw)
        _shelves(room, 1)
        room.place((0.5, 0.5, 0.6), "wood", tint=wood, top=True)
    elif style == "bathroom":
        room.place((1.7, 0.75, 0.55), "white_furniture", tint=white)
        room.place((0.8, 0.5, 0.85), "white_furniture", tint=white, top=True)
        room.place((0.4, 0.65, 0.75), "white_furniture", tint=white)
        room.place((0.6, 0.35, 0.7), "white_furniture", tint=white, z=1.2)
    elif style == "dining_room":
        room.place((1.6, 0.9, 0.75), "wood", wall=False, tint=wood, top=True)
        _chairs(room, 6, wood)
        room.place((1.5, 0.45, 0.9), "wood", tint=wood, top=True)
        _shelves(room, 1, 1.2)
    elif style == "office":
        for _ in range(int(rng.integers(3, 6))):
            frame = room.place((1.4, 0.7, 0.74), "wood", tint=wood, top=True)
            if frame is not None:
                cx, cy, yaw = frame
                room.b.add("box", "screen", [cx, cy, 0.76], (0.55, 0.05, 0.35), yaw)
        _chairs(room, 3, fabric)
        _shelves(room, 2)
        room.place((0.5, 0.6, 1.3), "metal")
    elif style == "classroom":
        for _ in range(12):
            room.place((1.1, 0.5, 0.72), "wood", wall=False, tint=wood, top=True, tries=10)
        _chairs(room, 8, wood)
        room.place((3.0, 0.05, 1.2), "white_furniture", z=0.9)
        room.place((1.4, 0.7, 0.74), "wood", tint=wood, top=True)
    elif style == "store":
        for _ in range(6):
            frame = room.place(
                (float(rng.uniform(1.5, 3.0)), 0.5, 1.6), "metal", wall=False, tries=20
            )
            if frame is not None:
                cx, cy, yaw = frame
                c, s = np.cos(yaw), np.sin(yaw)
                xs = np.linspace(-1.0, 1.0, 9)
                for z in (0.1, 0.6, 1.1):
                    room.b.add(
                        "box",
                        "fabric",
                        np.stack([cx + c * xs, cy + s * xs, np.full(9, z)], 1),
                        (0.2, 0.56, 0.35),
                        yaw,
                        rng.uniform(0.3, 2.2, (9, 3)),
                    )
        _shelves(room, 3, 2.0)
    elif style == "lobby":
        for _ in range(4):
            room.place((0.5, 0.5, room.h), "concrete", wall=False)
        room.place((1.8, 0.5, 0.45), "wood", tint=wood)
        room.place((0.6, 0.6, 1.0), "foliage")
        room.place((2.0, 0.6, 1.05), "wood", tint=wood, top=True)
        _chairs(room, 4, fabric)
    elif style == "arena":
        for _ in range(8):
            sz = rng.uniform(0.4, 1.2, 3)
            room.place(
                (float(sz[0]), float(sz[1]), float(sz[2]) * 1.5),
                "wood",
                wall=False,
                tint=rng.uniform(0.5, 1.8, 3),
            )
        for _ in range(4):
            room.place((float(rng.uniform(0.6, 1.5)), 0.6, float(rng.uniform(0.5, 1.5))), "metal")
    else:
        raise ValueError(f"unknown room style {style!r}")


def indoor(rng: np.random.Generator, style: str, min_camera_height: float = 0.6) -> World:
    """One closed room of the given :data:`ROOM_STYLES` type, lamps on the ceiling.

    ``min_camera_height``: the lowest camera that will move through it (Spot ~0.6 m, Falcon
    >= 1 m, handheld ~1.5 m); furniture lower than that by 0.35 m may stand under its loop.
    """
    st = ROOM_STYLES[style]
    while True:
        w, d, h = rng.uniform(*st.width), rng.uniform(*st.depth), rng.uniform(*st.height)
        if w * w + d * d + h * h < 9.6**2:  # no point 9.6 m or more from any camera in it
            break
    clearance = min(float(rng.uniform(0.8, 1.2)), 0.5 * min(w, d) - 0.35)
    b = WorldBuilder()
    wall_tint = WALL_TINTS[rng.integers(len(WALL_TINTS))] * rng.uniform(0.9, 1.05)
    b.add("box", st.floor, [0, 0, -0.1], (w + 0.4, d + 0.4, 0.1), tint=rng.uniform(0.8, 1.2, 3))
    b.add("box", "ceiling", [0, 0, h], (w + 0.4, d + 0.4, 0.1))
    for cx, cy, sx, sy in (
        (0, -d / 2 - 0.05, w + 0.2, 0.1),
        (0, d / 2 + 0.05, w + 0.2, 0.1),
        (-w / 2 - 0.05, 0, 0.1, d + 0.2),
        (w / 2 + 0.05, 0, 0.1, d + 0.2),
    ):
        b.add("box", "wall_paint", [cx, cy, 0], (sx, sy, h), tint=wall_tint)
    room = _Room(b, rng, w, d, h, clearance, low_ok=min_camera_height - 0.35)
    for _ in range(st.windows):
        room.place((1.2, 0.04, 1.3), "window_day", z=0.9)
    room.place((0.9, 0.05, 2.05), "wood", tint=rng.uniform(0.5, 1.0, 3))
    if rng.random() < 0.5 and style not in ("bathroom", "arena"):
        room.place(
            (float(rng.uniform(1.5, 2.5)), float(rng.uniform(1.0, 2.0)), 0.01),
            "carpet",
            wall=False,
            tint=rng.uniform(0.4, 1.8, 3),
            z=0.001,
        )
    _furnish(room, style)
    room.clutter(int(rng.integers(3, 12)))
    for _ in range(int(rng.integers(1, 4))):
        room.place(
            (float(rng.uniform(0.4, 1.0)), 0.03, float(rng.uniform(0.3, 0.8))),
            "fabric",
            tint=rng.uniform(0.3, 2.2, 3),
            z=float(rng.uniform(1.2, 1.6)),
        )
    nl = st.lamps
    gx = max(1, round(float(np.sqrt(nl * w / d))))
    gy = max(1, int(np.ceil(nl / gx)))
    xs = (np.arange(gx) + 0.5) / gx * w - w / 2
    ys = (np.arange(gy) + 0.5) / gy * d - d / 2
    pts = np.array([[x, y, h - 0.05] for x in xs for y in ys])
    b.add("box", "lamp_head", pts, (0.5, 0.5, 0.05))
    b.add_lights(Lights.make(pts - [0, 0, 0.1], 0.004, WARM))
    path = Path(room.ring, closed=True)
    lanes = {"default": Lane(0.0)}
    return b.build(path, "indoor", lanes, margin=0.0)


BUILDERS: dict[str, Callable[..., World]] = {"urban": urban, "forest": forest, "indoor": indoor}
