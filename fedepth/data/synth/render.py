"""Ray-cast rendering of a :class:`~fedepth.data.synth.world.World`: depth and a camera image.

Per pixel, one primary ray (Embree) gives the hit and its z-depth; the image is a diffuse shading
of the hit under the environment's light (sun + sky with one shadow ray by day; street lamps,
lit windows and the platform's headlight by night; ceiling lamps indoors), exposed by an
auto-exposure with the limits of a 25 Hz rolling-shutter camera, with photon shot noise and read
noise, gamma-encoded to 8 bits. Rays that hit nothing see the sky and get no depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedepth.data.camera import Camera
from fedepth.data.synth.world import MATERIAL_NAMES, MATERIALS, Lights, World

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

_PERM = np.random.default_rng(12345).permutation(256).astype(np.int64)
_PERM2 = np.concatenate([_PERM, _PERM])
_TEX_SCALE = np.array([MATERIALS[n].scale for n in MATERIAL_NAMES], dtype=np.float32)
_TEX_AMP = np.array([MATERIALS[n].texture for n in MATERIAL_NAMES], dtype=np.float32)
_LAMP = np.array([MATERIALS[n].glow == "lamp" for n in MATERIAL_NAMES], dtype=np.float32)
_DAYLIGHT = np.array([MATERIALS[n].glow == "daylight" for n in MATERIAL_NAMES], dtype=np.float32)
_WINDOWS = np.array([MATERIALS[n].windows for n in MATERIAL_NAMES], dtype=bool)


def _hash3(ix: npt.NDArray[np.int64], iy: npt.NDArray[np.int64], iz: npt.NDArray[np.int64]) -> F32:
    h = _PERM2[(_PERM2[(_PERM[ix & 255] + iy) & 511] + iz) & 511]
    return (h.astype(np.float32) / 255.0).astype(np.float32)


def value_noise(p: F32) -> F32:
    """Smooth 3-D value noise in [0, 1] at points (N, 3) (Perlin's permutation-table hash)."""
    fl = np.floor(p)
    i = fl.astype(np.int64)
    f = (p - fl).astype(np.float32)
    u = f * f * (3.0 - 2.0 * f)
    out = np.zeros(p.shape[0], dtype=np.float32)
    for dx in (0, 1):
        wx = u[:, 0] if dx else 1.0 - u[:, 0]
        for dy in (0, 1):
            wy = u[:, 1] if dy else 1.0 - u[:, 1]
            for dz in (0, 1):
                wz = u[:, 2] if dz else 1.0 - u[:, 2]
                out += wx * wy * wz * _hash3(i[:, 0] + dx, i[:, 1] + dy, i[:, 2] + dz)
    return out


@dataclass(frozen=True)
class Lighting:
    """The light of one capture condition.

    Units: irradiance relative to direct noon sun on a surface facing it (1.0 ~ 50-100 klux).
    Day: ``sun`` along ``sun_dir`` plus sky ``ambient`` (~0.2-0.3 of the sun under clear sky,
    more share under overcast). Night: no sun, moon + sky glow ~1e-6 (0.1 lux), street lamps
    (~10-20 lux below them, i.e. ~3e-4) and lit windows (~100 cd/m^2, ~1e-2 of a sunlit white
    wall). Indoor: ceiling lamps (~300-500 lux at desk height, AE makes the absolute level moot)
    plus inter-reflection ``ambient``; a window seen from inside is daylight, ~30-100 x brighter
    than the lit room (``daylight_glow``). ``lamp_glow``: radiance of lamp heads and fixtures.
    """

    name: str
    sun: float = 0.0
    sun_dir: tuple[float, float, float] = (0.0, 0.0, 1.0)
    ambient: float = 0.25
    sky_horizon: tuple[float, float, float] = (0.85, 0.88, 0.95)
    sky_zenith: tuple[float, float, float] = (0.30, 0.48, 0.85)
    lamps: bool = False
    lit_windows: float = 0.0
    window_radiance: float = 0.01
    lamp_glow: float = 0.0
    daylight_glow: float = 0.0


def day_lighting(rng: np.random.Generator) -> Lighting:
    """Daylight for one sequence: sun elevation 20-65 deg, random azimuth, clear to overcast."""
    elev = np.deg2rad(rng.uniform(20.0, 65.0))
    az = rng.uniform(0.0, 2 * np.pi)
    overcast = rng.uniform(0.0, 1.0)
    sun = 1.0 - 0.8 * overcast
    sd = (float(np.cos(elev) * np.cos(az)), float(np.cos(elev) * np.sin(az)), float(np.sin(elev)))
    grey = overcast * 0.6
    zen = tuple(float((1 - grey) * c + grey * 0.8) for c in (0.30, 0.48, 0.85))
    return Lighting("day", sun=sun, sun_dir=sd, ambient=0.22 + 0.25 * overcast, sky_zenith=zen)  # type: ignore[arg-type]


def night_lighting(rng: np.random.Generator) -> Lighting:
    """Urban night: sky glow only, street lamps on, 20-40 % of windows lit."""
    return Lighting(
        "night",
        sun=0.0,
        ambient=2e-6,
        sky_horizon=(3e-4, 2.2e-4, 1.5e-4),
        sky_zenith=(4e-5, 5e-5, 8e-5),
        lamps=True,
        lit_windows=float(rng.uniform(0.2, 0.4)),
        window_radiance=0.01,
        lamp_glow=0.05,
    )


def indoor_lighting(rng: np.random.Generator) -> Lighting:
    """Room lamps plus diffuse inter-reflection; no sky."""
    ambient = float(rng.uniform(2e-4, 5e-4))
    return Lighting(
        "indoor",
        sun=0.0,
        ambient=ambient,
        sky_horizon=(0.0, 0.0, 0.0),
        sky_zenith=(0.0, 0.0, 0.0),
        lamps=True,
        lamp_glow=0.02,
        daylight_glow=float(rng.uniform(0.01, 0.04)),
    )


@dataclass(frozen=True)
class Sensor:
    """Camera exposure and noise.

    Exposure 1.0 is a ~0.5 ms daylight shutter at unit gain. The auto-exposure brings the mean
    linear signal to ``target`` (18 % grey) but cannot expose longer than one frame at 25 Hz
    (40 ms, ``max_shutter`` = 80 x the daylight shutter) nor amplify more
    than ``max_gain`` (16 x analogue gain, as on the AR0144 / IMX sensors of the datasets); at
    night the image stays dark and gain multiplies the noise. Noise: photon shot noise with a
    ``full_well`` of ~10 ke- and ``read_noise`` ~3 e- (typical small-pixel CMOS).
    """

    target: float = 0.18
    max_shutter: float = 80.0
    max_gain: float = 16.0
    full_well: float = 10000.0
    read_noise: float = 3.0
    gamma: float = 2.2


class Renderer:
    """Renders depth (and optionally images) of one world; caches per-camera ray tables."""

    def __init__(self, world: World, sensor: Sensor | None = None) -> None:
        self.world = world
        self.sensor = sensor or Sensor()
        self._rays: dict[Camera, tuple[F32, F32]] = {}

    def rays(self, cam: Camera) -> tuple[F32, F32]:
        """Unit ray directions (H*W, 3) in the camera frame and their z components."""
        if cam not in self._rays:
            x, y = cam.pixel_rays()
            d = np.stack([x.ravel(), y.ravel(), np.ones(x.size)], 1)
            d /= np.linalg.norm(d, axis=1, keepdims=True)
            self._rays[cam] = (d.astype(np.float32), d[:, 2].astype(np.float32))
        return self._rays[cam]

    def render(
        self,
        cam: Camera,
        T_world_cam: F64,
        *,
        lighting: Lighting | None = None,
        max_range: float = 1e4,
        extra_lights: Lights | None = None,
        rng: np.random.Generator | None = None,
    ) -> tuple[npt.NDArray[np.uint8] | None, F32]:
        """(image or None, z-depth) seen by ``cam`` at pose ``T_world_cam`` (camera -> world).

        Depth is float32 metres, 0 where the ray hits nothing or beyond ``max_range``. Without
        ``lighting`` only depth is computed (the image is None).
        """
        d_cam, zf = self.rays(cam)
        R = T_world_cam[:3, :3]
        o = T_world_cam[:3, 3]
        d = (d_cam @ R.T.astype(np.float32)).astype(np.float32)
        origins = np.broadcast_to(o.astype(np.float32), d.shape)
        t, prim = self.world.intersect(origins, d)
        hit = prim >= 0
        depth = np.where(hit, t * zf, 0.0).astype(np.float32)
        depth[depth > max_range] = 0.0
        depth = depth.reshape(cam.height, cam.width)
        if lighting is None:
            return None, depth
        radiance = self._shade(d, o, t, prim, hit, lighting, extra_lights, cam)
        image = self._expose(radiance, rng or np.random.default_rng(0))
        return image.reshape(cam.height, cam.width, 3), depth

    def _shade(
        self,
        d: F32,
        o: F64,
        t: F32,
        prim: npt.NDArray[np.int32],
        hit: npt.NDArray[np.bool_],
        light: Lighting,
        extra: Lights | None,
        cam: Camera,
    ) -> F32:
        w = self.world
        out = np.empty((d.shape[0], 3), dtype=np.float32)
        # sky
        sky = ~hit
        if sky.any():
            elev = np.clip(d[sky, 2], 0.0, 1.0)[:, None] ** 0.5
            hz = np.asarray(light.sky_horizon, dtype=np.float32)
            zn = np.asarray(light.sky_zenith, dtype=np.float32)
            out[sky] = hz * (1 - elev) + zn * elev
        if not hit.any():
            return out
        ph = prim[hit]
        th = t[hit]
        dh = d[hit]
        p = (o.astype(np.float32) + dh * th[:, None]).astype(np.float32)
        n = w.normals[ph]
        flip = np.einsum("ij,ij->i", n, dh) > 0
        n = np.where(flip[:, None], -n, n)
        mat = w.material[ph]
        # texture, faded out where a pixel covers more than one noise cell (anti-aliasing)
        scale = _TEX_SCALE[mat]
        footprint = th / cam.fx * scale.max(axis=1)
        amp = _TEX_AMP[mat] / (1.0 + (2.0 * footprint) ** 2)
        tex = 0.65 * value_noise(p * scale) + 0.35 * value_noise(p * scale * 3.7 + 17.0)
        albedo = w.albedo[ph] * (1.0 + amp * (2.0 * tex - 1.0))[:, None]
        emis = np.zeros_like(albedo)
        # facade window grid: 1.4 m windows every 3 m, one row per 3.2 m storey above 1.2 m
        win = _WINDOWS[mat] & (np.abs(n[:, 2]) < 0.3)
        if win.any():
            u = np.einsum("ij,ij->i", p[win], w.tangents[ph[win]])
            z = p[win, 2]
            fu = np.mod(u / 3.0, 1.0)
            fz = np.mod(z / 3.2, 1.0)
            inside = (fu > 0.27) & (fu < 0.73) & (fz > 0.3) & (fz < 0.8) & (z > 1.2)
            idx = np.flatnonzero(win)[inside]
            albedo[idx] = (0.05, 0.06, 0.075)
            if light.lit_windows > 0:
                cu = np.floor(u[inside] / 3.0).astype(np.int64)
                cz = np.floor(z[inside] / 3.2).astype(np.int64)
                key = np.rint(np.einsum("ij,ij->i", p[idx], n[idx]) * 2).astype(np.int64)
                lit = _hash3(cu, cz, key) < light.lit_windows
                emis[idx[lit]] = light.window_radiance * np.array([1.0, 0.85, 0.6], np.float32)
        irr = np.full((ph.size, 3), light.ambient, dtype=np.float32) * (
            0.6 + 0.4 * np.clip(n[:, 2:3], -1.0, 1.0)
        )
        if light.sun > 0:
            s = np.asarray(light.sun_dir, dtype=np.float32)
            cos = np.clip(n @ s, 0.0, None)
            lit = cos > 0
            if lit.any():
                origin = p[lit] + n[lit] * 0.02
                shadow = w.occluded(origin, np.broadcast_to(s, origin.shape))
                cos[np.flatnonzero(lit)[shadow]] = 0.0
            irr += (light.sun * cos)[:, None] * np.array([1.0, 0.97, 0.92], np.float32)
        lights = w.lights if light.lamps else Lights()
        if extra is not None:
            lights = lights.concat(extra)
        if len(lights):
            irr += _point_lights(p, n, lights, o)
        emis += (_LAMP[mat] * light.lamp_glow + _DAYLIGHT[mat] * light.daylight_glow)[:, None]
        out[hit] = albedo * irr + emis
        return out

    def _expose(self, radiance: F32, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
        s = self.sensor
        lum = radiance @ np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)
        mean = float(np.mean(np.minimum(lum, 8.0 * max(float(np.median(lum)), 1e-9))))
        exposure = float(np.clip(s.target / max(mean, 1e-12), 0.02, s.max_shutter * s.max_gain))
        gain = max(1.0, exposure / s.max_shutter)
        signal = np.clip(radiance * exposure, 0.0, 1.0)
        electrons = signal * (s.full_well / gain)
        noisy = electrons + rng.standard_normal(electrons.shape).astype(np.float32) * np.sqrt(
            electrons + s.read_noise**2
        )
        v = np.clip(noisy * (gain / s.full_well), 0.0, 1.0) ** (1.0 / s.gamma)
        return (v * 255.0 + 0.5).astype(np.uint8)


def _point_lights(p: F32, n: F32, lights: Lights, eye: F64) -> F32:
    """Irradiance from lamps within 80 m of the camera: I cos / r^2 with a smooth spot cone."""
    near = np.linalg.norm(lights.pos - eye, axis=1) < 80.0
    pos = lights.pos[near].astype(np.float32)
    if pos.shape[0] == 0:
        return np.zeros((p.shape[0], 3), dtype=np.float32)
    v = pos[None, :, :] - p[:, None, :]
    r2 = np.maximum(np.einsum("ijk,ijk->ij", v, v), 0.25)
    ln = v / np.sqrt(r2)[..., None]
    cos = np.clip(np.einsum("ijk,ik->ij", ln, n), 0.0, None)
    axis = lights.axis[near].astype(np.float32)
    cone = lights.cone[near].astype(np.float32)
    ang = np.arccos(np.clip(-np.einsum("ijk,jk->ij", ln, axis), -1.0, 1.0))
    spot = np.where(cone[None, :] >= np.pi, 1.0, np.exp(-((ang / cone[None, :]) ** 2)))
    e = lights.power[near].astype(np.float32)[None, :] * cos * spot / r2
    return (e @ lights.color[near].astype(np.float32)).astype(np.float32)
