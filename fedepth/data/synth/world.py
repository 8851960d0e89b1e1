"""Scene geometry for the ray caster: instanced triangle meshes, materials, lights and paths.

A :class:`World` is one static triangle soup (vertices, faces, a material and a tinted albedo per
face) plus point / spot lights and the path robots move along. It is built by
:class:`WorldBuilder` from template meshes made by trimesh (boxes, cylinders, cones, spheres),
instanced with numpy, and ray cast by Embree (:mod:`embreex`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt
import trimesh
from embreex import rtcore_scene
from embreex.mesh_construction import TriangleMesh
from scipy.spatial import cKDTree

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Material:
    """Surface reflectance and texture.

    ``albedo``: linear diffuse reflectance (typical measured values, see each entry of
    :data:`MATERIALS`). ``texture``: relative amplitude of value-noise modulation, ``scale``: its
    frequency (1/m) along world x, y, z (anisotropic for bark streaks and wood grain).
    ``windows``: facade with a window grid (dark glass by day, some lit at night). ``glow``:
    a light-emitting surface, ``"lamp"`` (lamp heads and ceiling fixtures, lit at night and
    indoors) or ``"daylight"`` (a window seen from inside a room).
    """

    albedo: tuple[float, float, float]
    texture: float = 0.2
    scale: tuple[float, float, float] = (1.0, 1.0, 1.0)
    windows: bool = False
    glow: str = ""


#: Material catalogue. Albedos are typical broadband reflectances: fresh asphalt ~0.05-0.10,
#: concrete ~0.25-0.35, red brick ~0.2-0.3, grass and foliage ~0.1-0.25 (green), bark ~0.1-0.2,
#: dry sand ~0.3-0.4, forest litter ~0.1-0.15, white interior paint ~0.7-0.85, wood ~0.2-0.4.
MATERIALS: dict[str, Material] = {
    "asphalt": Material((0.08, 0.08, 0.085), 0.35, (3.0, 3.0, 3.0)),
    "lane_paint": Material((0.65, 0.65, 0.6), 0.1, (2.0, 2.0, 2.0)),
    "concrete": Material((0.30, 0.29, 0.27), 0.25, (1.5, 1.5, 1.5)),
    "brick": Material((0.30, 0.14, 0.10), 0.3, (4.0, 4.0, 6.0), windows=True),
    "facade": Material((0.40, 0.38, 0.34), 0.2, (0.7, 0.7, 0.7), windows=True),
    "glass_facade": Material((0.12, 0.16, 0.20), 0.15, (0.3, 0.3, 0.3), windows=True),
    "roof": Material((0.15, 0.14, 0.14), 0.3, (1.0, 1.0, 1.0)),
    "grass": Material((0.10, 0.20, 0.06), 0.45, (2.0, 2.0, 2.0)),
    "foliage": Material((0.06, 0.14, 0.05), 0.5, (1.5, 1.5, 1.5)),
    "bark": Material((0.13, 0.10, 0.07), 0.4, (6.0, 6.0, 0.4)),
    "litter": Material((0.14, 0.11, 0.07), 0.5, (1.2, 1.2, 1.2)),
    "dirt": Material((0.26, 0.20, 0.14), 0.35, (1.5, 1.5, 1.5)),
    "sand": Material((0.38, 0.33, 0.25), 0.25, (2.0, 2.0, 2.0)),
    "water": Material((0.03, 0.04, 0.05), 0.1, (0.5, 0.5, 0.5)),
    "car_paint": Material((0.5, 0.5, 0.5), 0.05, (1.0, 1.0, 1.0)),
    "car_glass": Material((0.04, 0.05, 0.06), 0.05, (1.0, 1.0, 1.0)),
    "metal": Material((0.35, 0.35, 0.37), 0.1, (2.0, 2.0, 2.0)),
    "lamp_head": Material((0.5, 0.5, 0.45), 0.0, (1.0, 1.0, 1.0), glow="lamp"),
    "wall_paint": Material((0.75, 0.73, 0.68), 0.08, (1.0, 1.0, 1.0)),
    "ceiling": Material((0.82, 0.82, 0.80), 0.05, (1.0, 1.0, 1.0)),
    "floor_wood": Material((0.35, 0.22, 0.12), 0.35, (8.0, 0.8, 1.0)),
    "floor_tile": Material((0.55, 0.55, 0.52), 0.2, (2.5, 2.5, 2.5)),
    "carpet": Material((0.25, 0.22, 0.20), 0.3, (6.0, 6.0, 6.0)),
    "wood": Material((0.30, 0.19, 0.10), 0.3, (6.0, 0.6, 0.6)),
    "fabric": Material((0.35, 0.30, 0.28), 0.25, (8.0, 8.0, 8.0)),
    "white_furniture": Material((0.70, 0.70, 0.68), 0.08, (2.0, 2.0, 2.0)),
    "screen": Material((0.03, 0.03, 0.035), 0.02, (1.0, 1.0, 1.0)),
    "window_day": Material((0.9, 0.92, 0.95), 0.05, (1.0, 1.0, 1.0), glow="daylight"),
    "rock": Material((0.25, 0.24, 0.22), 0.4, (1.0, 1.0, 1.0)),
}
MATERIAL_NAMES = tuple(MATERIALS)
MATERIAL_ID = {name: i for i, name in enumerate(MATERIAL_NAMES)}


@cache
def template(kind: str) -> tuple[F64, npt.NDArray[np.int64]]:
    """Unit template meshes (vertices, faces) built by trimesh; all rest on z = 0.

    box: 1 x 1 x 1 centred in x, y; cylinder: radius 1, height 1; cone: radius 1, height 1;
    sphere: radius 1 centred at the origin; prism: a gable roof, 1 x 1 base, apex height 1.
    """
    if kind == "box":
        m = trimesh.creation.box(extents=(1.0, 1.0, 1.0))
        m.apply_translation((0.0, 0.0, 0.5))
    elif kind == "cylinder":
        m = trimesh.creation.cylinder(radius=1.0, height=1.0, sections=10)
        m.apply_translation((0.0, 0.0, 0.5))
    elif kind == "cone":
        m = trimesh.creation.cone(radius=1.0, height=1.0, sections=10)
    elif kind == "sphere":
        m = trimesh.creation.icosphere(subdivisions=1, radius=1.0)
    elif kind == "prism":
        v = np.array(
            [
                [-0.5, -0.5, 0],
                [0.5, -0.5, 0],
                [0.5, 0.5, 0],
                [-0.5, 0.5, 0],
                [-0.5, 0.0, 1],
                [0.5, 0.0, 1],
            ],
            dtype=np.float64,
        )
        f = np.array(
            [
                [0, 1, 5],
                [0, 5, 4],
                [2, 3, 4],
                [2, 4, 5],
                [1, 2, 5],
                [3, 0, 4],
                [0, 2, 1],
                [0, 3, 2],
            ]
        )
        m = trimesh.Trimesh(v, f, process=False)
    else:
        raise ValueError(f"unknown template {kind!r}")
    return np.asarray(m.vertices, dtype=np.float64), np.asarray(m.faces, dtype=np.int64)


def rot_z(yaw: npt.ArrayLike) -> F64:
    """Rotation matrices (..., 3, 3) about +z."""
    a = np.asarray(yaw, dtype=np.float64)
    c, s = np.cos(a), np.sin(a)
    z, o = np.zeros_like(a), np.ones_like(a)
    return np.stack(
        [np.stack([c, -s, z], -1), np.stack([s, c, z], -1), np.stack([z, z, o], -1)], -2
    )


@dataclass
class Lights:
    """Point and spot lights: position, intensity (units: sunlit-irradiance x m^2), colour,
    axis and cone half-width (radians; >= pi for an omnidirectional lamp)."""

    pos: F64 = field(default_factory=lambda: np.zeros((0, 3)))
    power: F64 = field(default_factory=lambda: np.zeros(0))
    color: F64 = field(default_factory=lambda: np.zeros((0, 3)))
    axis: F64 = field(default_factory=lambda: np.zeros((0, 3)))
    cone: F64 = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return int(self.power.size)

    def concat(self, other: Lights) -> Lights:
        return Lights(
            *(
                np.concatenate([a, b])
                for a, b in (
                    (self.pos, other.pos),
                    (self.power, other.power),
                    (self.color, other.color),
                    (self.axis, other.axis),
                    (self.cone, other.cone),
                )
            )
        )

    @staticmethod
    def make(
        pos: npt.ArrayLike,
        power: float,
        color: tuple[float, float, float],
        axis: npt.ArrayLike = (0.0, 0.0, -1.0),
        cone: float = np.pi,
    ) -> Lights:
        p = np.atleast_2d(np.asarray(pos, dtype=np.float64))
        n = p.shape[0]
        ax = np.broadcast_to(np.asarray(axis, dtype=np.float64), (n, 3)).copy()
        ax /= np.linalg.norm(ax, axis=1, keepdims=True)
        return Lights(
            p, np.full(n, power), np.tile(np.asarray(color, float), (n, 1)), ax, np.full(n, cone)
        )


class Path:
    """A robot route: a polyline in the ground plane parameterised by arc length s (metres)."""

    def __init__(self, xy: npt.ArrayLike, closed: bool = False) -> None:
        pts = np.asarray(xy, dtype=np.float64)
        if closed:
            pts = np.concatenate([pts, pts[:1]])
        seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
        self.xy = pts
        self.s = np.concatenate([[0.0], np.cumsum(seg)])
        self.closed = closed
        d = np.diff(pts, axis=0)
        heading = np.unwrap(np.arctan2(d[:, 1], d[:, 0]))
        self._heading = np.concatenate([heading, heading[-1:]])

    @property
    def length(self) -> float:
        return float(self.s[-1])

    def _wrap(self, s: npt.ArrayLike) -> F64:
        s = np.asarray(s, dtype=np.float64)
        return np.mod(s, self.length) if self.closed else np.clip(s, 0.0, self.length)

    def point(self, s: npt.ArrayLike) -> F64:
        """(..., 2) positions at arc length s."""
        s = self._wrap(s)
        return np.stack(
            [np.interp(s, self.s, self.xy[:, 0]), np.interp(s, self.s, self.xy[:, 1])], -1
        )

    def heading(self, s: npt.ArrayLike) -> F64:
        """Direction of travel (radians) at s, smoothed over +-2 m."""
        s = np.asarray(s, dtype=np.float64)
        a = self.point(s - 2.0)
        b = self.point(s + 2.0)
        return np.arctan2(b[..., 1] - a[..., 1], b[..., 0] - a[..., 0])

    def offset(self, s: npt.ArrayLike, lateral: npt.ArrayLike) -> F64:
        """Positions at s shifted ``lateral`` metres to the left of the direction of travel."""
        h = self.heading(s)
        p = self.point(s)
        lat = np.asarray(lateral, dtype=np.float64)
        return p + np.stack([-np.sin(h) * lat, np.cos(h) * lat], -1)


def meander(
    rng: np.random.Generator,
    length: float,
    curviness: float,
    step: float = 1.0,
    heading0: float = 0.0,
) -> npt.NDArray[np.float64]:
    """A smooth random route of ``length`` metres: heading = sum of slow sinusoids.

    ``curviness`` is the heading amplitude in radians (0 = straight street; ~0.3 = a winding
    forest trail) spread over wavelengths of 60-400 m.
    """
    s = np.arange(0.0, length + step, step)
    heading = np.full_like(s, heading0)
    for _ in range(3):
        lam = rng.uniform(60.0, 400.0)
        heading += curviness / 3 * np.sin(2 * np.pi * s / lam + rng.uniform(0, 2 * np.pi))
    xy = np.zeros((s.size, 2))
    xy[1:, 0] = np.cumsum(np.cos(heading[:-1]) * step)
    xy[1:, 1] = np.cumsum(np.sin(heading[:-1]) * step)
    return xy


class WorldBuilder:
    """Collects instanced meshes with their materials and tints, then builds a :class:`World`."""

    def __init__(self) -> None:
        self._verts: list[F64] = []
        self._faces: list[npt.NDArray[np.int64]] = []
        self._mat: list[npt.NDArray[np.int16]] = []
        self._tint: list[F32] = []
        self._nv = 0
        self.lights = Lights()

    def add_mesh(
        self,
        vertices: npt.ArrayLike,
        faces: npt.ArrayLike,
        material: str,
        tint: npt.ArrayLike | None = None,
    ) -> None:
        """One mesh; ``tint`` multiplies the material albedo, per face (F, 3) or overall (3,)."""
        v = np.asarray(vertices, dtype=np.float64)
        f = np.asarray(faces, dtype=np.int64)
        self._verts.append(v)
        self._faces.append(f + self._nv)
        self._nv += v.shape[0]
        self._mat.append(np.full(f.shape[0], MATERIAL_ID[material], dtype=np.int16))
        t = np.ones(3) if tint is None else np.asarray(tint, dtype=np.float64)
        self._tint.append(np.broadcast_to(t, (f.shape[0], 3)).astype(np.float32))

    def add(
        self,
        kind: str,
        material: str,
        center: npt.ArrayLike,
        size: npt.ArrayLike,
        yaw: npt.ArrayLike = 0.0,
        tint: npt.ArrayLike | None = None,
        tilt: npt.ArrayLike | None = None,
    ) -> None:
        """Instances of a template: ``center`` (N, 3) base points, ``size`` (N, 3) scale along
        the template axes, ``yaw`` (N,), ``tint`` (N, 3); ``tilt`` (N,) rotates about the
        template's x axis first (a fallen log has tilt pi/2)."""
        tv, tf = template(kind)
        c = np.atleast_2d(np.asarray(center, dtype=np.float64))
        n = c.shape[0]
        if n == 0:
            return
        sz = np.broadcast_to(np.asarray(size, dtype=np.float64), (n, 3))
        R = rot_z(np.broadcast_to(np.asarray(yaw, dtype=np.float64), (n,)))
        local = tv[None, :, :] * sz[:, None, :]
        if tilt is not None:
            a = np.broadcast_to(np.asarray(tilt, dtype=np.float64), (n,))
            ca, sa = np.cos(a)[:, None], np.sin(a)[:, None]
            y = local[..., 1] * ca - local[..., 2] * sa
            z = local[..., 1] * sa + local[..., 2] * ca
            local = np.stack([local[..., 0], y, z], -1)
        verts = np.einsum("nij,nvj->nvi", R, local) + c[:, None, :]
        faces = tf[None, :, :] + (np.arange(n) * tv.shape[0])[:, None, None]
        t = np.ones((n, 3)) if tint is None else np.broadcast_to(np.asarray(tint, float), (n, 3))
        tints = np.repeat(t, tf.shape[0], axis=0)
        self.add_mesh(verts.reshape(-1, 3), faces.reshape(-1, 3), material, tints)

    def add_strip(self, left: npt.ArrayLike, right: npt.ArrayLike, material: str) -> None:
        """A ribbon between two (N, 3) polylines (roads, sidewalks, trails)."""
        a = np.asarray(left, dtype=np.float64)
        b = np.asarray(right, dtype=np.float64)
        n = a.shape[0]
        v = np.concatenate([a, b])
        i = np.arange(n - 1)
        f = np.concatenate(
            [np.stack([i, i + n, i + 1], 1), np.stack([i + 1, i + n, i + n + 1], 1)]
        )
        self.add_mesh(v, f, material)

    def add_heightfield(
        self, x: F64, y: F64, z: F64, materials: list[str], face_material: npt.NDArray[np.int64]
    ) -> None:
        """A terrain grid of heights ``z`` (ny, nx) over ``x`` (nx,) and ``y`` (ny,); triangle k
        gets ``materials[face_material[k]]`` (2 (ny-1) (nx-1) triangles, lower halves first)."""
        X, Y = np.meshgrid(x, y)
        v = np.stack([X.ravel(), Y.ravel(), z.ravel()], 1)
        nx = x.size
        r, c = np.mgrid[0 : y.size - 1, 0 : nx - 1]
        i0 = (r * nx + c).ravel()
        f = np.concatenate(
            [np.stack([i0, i0 + 1, i0 + nx + 1], 1), np.stack([i0, i0 + nx + 1, i0 + nx], 1)]
        )
        for k, name in enumerate(materials):
            sel = face_material == k
            if sel.any():
                self.add_mesh(v, f[sel], name)

    def add_lights(self, lights: Lights) -> None:
        self.lights = self.lights.concat(lights)

    def build(
        self,
        path: Path,
        kind: str,
        lanes: dict[str, Lane],
        margin: float,
        ground: Terrain | None = None,
    ) -> World:
        if not self._faces:
            raise ValueError("empty world")
        return World(
            vertices=np.concatenate(self._verts).astype(np.float32),
            faces=np.concatenate(self._faces).astype(np.int32),
            material=np.concatenate(self._mat),
            tint=np.concatenate(self._tint),
            lights=self.lights,
            path=path,
            kind=kind,
            lanes=lanes,
            margin=margin,
            ground=ground,
        )


@dataclass(frozen=True)
class Lane:
    """Where a platform travels relative to the path: ``lateral`` metres to the left of the
    direction of travel, ``z`` metres above the terrain (a sidewalk is 0.15 m above the road)."""

    lateral: float
    z: float = 0.0


class Terrain:
    """Ground height z(x, y): a sum of sinusoids, flattened near the path (trails, roads)."""

    def __init__(
        self, rng: np.random.Generator, amplitude: float, path: Path, flat_width: float
    ) -> None:
        lam = rng.uniform(8.0, 60.0, size=5)
        ang = rng.uniform(0, 2 * np.pi, size=5)
        self.kx = 2 * np.pi / lam * np.cos(ang)
        self.ky = 2 * np.pi / lam * np.sin(ang)
        self.phase = rng.uniform(0, 2 * np.pi, size=5)
        self.amp = amplitude * lam / lam.sum()
        self.path = path
        self.flat_width = flat_width
        dense = path.point(np.arange(0.0, path.length + 0.5, 0.5))
        self._tree = cKDTree(dense)

    def distance_to_path(self, xy: npt.ArrayLike) -> F64:
        d, _ = self._tree.query(np.asarray(xy, dtype=np.float64))
        return np.asarray(d, dtype=np.float64)

    def height(self, xy: npt.ArrayLike) -> F64:
        p = np.asarray(xy, dtype=np.float64)
        x, y = p[..., 0:1], p[..., 1:2]
        h = (self.amp * np.sin(x * self.kx + y * self.ky + self.phase)).sum(-1)
        d = self.distance_to_path(p)
        w = np.clip((d - self.flat_width) / 4.0, 0.0, 1.0)
        return np.asarray(h * (0.15 + 0.85 * w), dtype=np.float64)


class World:
    """A built scene: triangles with materials, lights, a path, and an Embree scene.

    ``lanes`` says where each platform travels (key ``"default"`` for any other), ``margin`` how
    far from the path ends trajectories must stay (so views never reach the world's edge).
    """

    def __init__(
        self,
        vertices: F32,
        faces: npt.NDArray[np.int32],
        material: npt.NDArray[np.int16],
        tint: F32,
        lights: Lights,
        path: Path,
        kind: str,
        lanes: dict[str, Lane],
        margin: float,
        ground: Terrain | None = None,
    ) -> None:
        self.vertices = vertices
        self.faces = faces
        self.material = material
        self.kind = kind
        self.lights = lights
        self.path = path
        self.lanes = lanes
        self.margin = margin
        self.ground = ground
        albedo = np.array([MATERIALS[n].albedo for n in MATERIAL_NAMES], dtype=np.float32)
        self.albedo = np.clip(albedo[material] * tint, 0.0, 1.0).astype(np.float32)
        tri = vertices[faces].astype(np.float64)
        n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
        norm = np.linalg.norm(n, axis=1, keepdims=True)
        self.normals = (n / np.maximum(norm, 1e-12)).astype(np.float32)
        t = np.cross(self.normals, np.array([0.0, 0.0, 1.0]))
        tn = np.linalg.norm(t, axis=1, keepdims=True)
        self.tangents = np.where(tn > 1e-6, t / np.maximum(tn, 1e-12), [1.0, 0.0, 0.0]).astype(
            np.float32
        )
        self._scene: Any = None

    def lane(self, platform: str) -> Lane:
        return self.lanes.get(platform, self.lanes["default"])

    def ground_height(self, xy: npt.ArrayLike) -> F64:
        xy = np.asarray(xy, dtype=np.float64)
        return self.ground.height(xy) if self.ground is not None else np.zeros(xy.shape[:-1])

    @property
    def num_faces(self) -> int:
        return int(self.faces.shape[0])

    @property
    def scene(self) -> Any:
        """The Embree scene, built on first use."""
        if self._scene is None:
            self._scene = rtcore_scene.EmbreeScene()
            TriangleMesh(self._scene, self.vertices, self.faces)
        return self._scene

    def intersect(self, origins: F32, directions: F32) -> tuple[F32, npt.NDArray[np.int32]]:
        """Distance along each unit ray to the first hit and the triangle hit (-1: none)."""
        res = self.scene.run(
            np.ascontiguousarray(origins, dtype=np.float32),
            np.ascontiguousarray(directions, dtype=np.float32),
            output=1,
        )
        return res["tfar"], res["primID"]

    def occluded(
        self, origins: F32, directions: F32, max_dist: F32 | float = 1e30
    ) -> npt.NDArray[np.bool_]:
        """Whether anything lies along each ray within ``max_dist``."""
        o = np.ascontiguousarray(origins, dtype=np.float32)
        dists = np.broadcast_to(np.asarray(max_dist, dtype=np.float32), (o.shape[0],)).copy()
        hit = self.scene.run(
            o, np.ascontiguousarray(directions, dtype=np.float32), dists=dists, query="OCCLUDED"
        )
        return np.asarray(hit) != -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_scene"] = None
        return state
