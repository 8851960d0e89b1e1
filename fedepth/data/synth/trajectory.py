"""Continuous camera trajectories: each platform's motion along a world's path as a function of t.

A trajectory is smooth in time (sums of sinusoids with random phases on top of travel along the
path), so the 25 Hz camera and the 10 Hz LiDAR sample one and the same motion. Motion models:

- ``smooth`` (car): speed +-10 %, lane keeping +-0.15 m, suspension pitch/roll of a few tenths
  of a degree at the ~1-1.5 Hz body mode (larger off-road).
- ``legged`` (Spot): trot gait at 1.6-2.2 Hz strides; the body bobs ~1.5 cm twice per stride and
  pitches / rolls ~1-2 deg once per stride; heading wobbles a few degrees.
- ``uav`` (Falcon): altitude above the terrain per environment with +-15 % slow climbs and
  descents, yaw sweeps of 15-40 deg every 10-30 s, rolls of a few degrees in turns.
- ``handheld``: walking bob ~1.5 cm at ~1.8 Hz steps, physiological hand tremor (8-12 Hz,
  ~0.15 deg) and slow looking around (yaw +-25 deg, pitch +-8 deg).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedepth.data.synth.platforms import Platform
from fedepth.data.synth.world import World

F64 = npt.NDArray[np.float64]

#: Camera axes in the body frame (body: x forward, y left, z up; camera: x right, y down, z fwd).
R_BODY_CAM = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])


def _rot(yaw: float, pitch: float, roll: float) -> F64:
    """R = Rz(yaw) Ry(pitch) Rx(roll); positive pitch tips the x axis down."""
    cy, sy = np.cos(yaw), np.sin(yaw)
    cp, sp = np.cos(pitch), np.sin(pitch)
    cr, sr = np.cos(roll), np.sin(roll)
    Rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
    Ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
    Rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
    return Rz @ Ry @ Rx


@dataclass(frozen=True)
class Wave:
    """a * sin(2 pi f t + phase)."""

    a: float
    f: float
    phase: float

    def __call__(self, t: float) -> float:
        return float(self.a * np.sin(2 * np.pi * self.f * t + self.phase))

    def integral(self, t: float) -> float:
        w = 2 * np.pi * self.f
        return float(self.a / w * (np.cos(self.phase) - np.cos(w * t + self.phase)))


def _wave(rng: np.random.Generator, amp: float, f_lo: float, f_hi: float) -> Wave:
    return Wave(amp, float(rng.uniform(f_lo, f_hi)), float(rng.uniform(0, 2 * np.pi)))


class Trajectory:
    """Pose of the platform's reference camera (the rig's left event camera) over time."""

    def __init__(
        self,
        world: World,
        platform: Platform,
        environment: str,
        rng: np.random.Generator,
        duration: float,
    ) -> None:
        self.world = world
        self.platform = platform
        self.duration = duration
        path = world.path
        self.speed = float(rng.uniform(*platform.speed_range(environment)))
        self.direction = 1.0 if (path.closed or rng.random() < 0.5) else -1.0
        distance = self.speed * duration * 1.1
        lo = world.margin + (distance if self.direction < 0 else 0.0)
        hi = path.length - world.margin - (0.0 if self.direction < 0 else distance)
        if path.closed:
            lo, hi = 0.0, path.length
        if hi < lo:
            raise ValueError(
                f"world path of {path.length:.0f} m is too short for {distance:.0f} m of travel "
                f"with {world.margin:.0f} m margins"
            )
        self.s0 = float(rng.uniform(lo, hi))
        lane = world.lane(platform.name)
        self.lateral = lane.lateral
        self.z_offset = lane.z
        self.tilt = np.deg2rad(rng.uniform(*platform.pitch_range(environment)))
        if platform.altitude is not None:
            self.height = float(rng.uniform(*platform.altitude.get(environment, (2.0, 6.0))))
        else:
            self.height = platform.height
        m = platform.motion
        deg = np.deg2rad
        rough = environment == "forest"
        self.speed_wave = _wave(rng, 0.1 * self.speed, 0.02, 0.08)
        if m == "smooth":
            self.lat = [_wave(rng, 0.15, 0.02, 0.1)]
            self.z = [_wave(rng, 0.03 if rough else 0.01, 1.0, 1.5)]
            self.pitch = [_wave(rng, deg(1.0 if rough else 0.3), 1.0, 1.5)]
            self.roll = [_wave(rng, deg(1.2 if rough else 0.2), 0.8, 1.4)]
            self.yaw = [_wave(rng, deg(1.0), 0.05, 0.2)]
        elif m == "legged":
            stride = float(rng.uniform(1.6, 2.2))
            self.lat = [_wave(rng, 0.4, 0.02, 0.08)]
            self.z = [Wave(0.015, 2 * stride, float(rng.uniform(0, 2 * np.pi)))]
            self.pitch = [Wave(deg(1.2), stride, float(rng.uniform(0, 2 * np.pi)))]
            self.roll = [Wave(deg(1.8), stride, float(rng.uniform(0, 2 * np.pi)))]
            self.yaw = [_wave(rng, deg(4.0), 0.05, 0.2), Wave(deg(1.0), stride, 0.3)]
        elif m == "uav":
            self.lat = [_wave(rng, 1.0 if environment != "indoor" else 0.2, 0.02, 0.08)]
            self.z = [_wave(rng, 0.15 * self.height, 0.02, 0.08)]
            self.pitch = [_wave(rng, deg(3.0), 0.1, 0.4)]
            self.roll = [_wave(rng, deg(3.0), 0.05, 0.3)]
            self.yaw = [_wave(rng, deg(float(rng.uniform(15.0, 40.0))), 0.03, 0.1)]
        elif m == "handheld":
            self.lat = [_wave(rng, 0.3, 0.02, 0.1)]
            self.z = [_wave(rng, 0.015, 1.7, 1.9), _wave(rng, 0.05, 0.05, 0.2)]
            self.pitch = [_wave(rng, deg(8.0), 0.05, 0.15), _wave(rng, deg(0.15), 8.0, 12.0)]
            self.roll = [_wave(rng, deg(2.0), 0.05, 0.2), _wave(rng, deg(0.15), 8.0, 12.0)]
            self.yaw = [_wave(rng, deg(25.0), 0.04, 0.12), _wave(rng, deg(0.15), 8.0, 12.0)]
        else:
            raise ValueError(f"unknown motion model {m!r}")
        # Indoors the path is a loop around the room: look partly towards its centre (on the
        # left of a counter-clockwise loop) to see furniture rather than the next wall; a person
        # looks into the room more than a robot driving forward does.
        bias = (30.0, 80.0) if m == "handheld" else (10.0, 40.0)
        self.yaw_bias = deg(float(rng.uniform(*bias))) if world.kind == "indoor" else 0.0

    def pose(self, t: float) -> F64:
        """4 x 4 camera-to-world transform of the reference camera at time t (seconds)."""
        w = self.world
        s = self.s0 + self.direction * (self.speed * t + self.speed_wave.integral(t))
        lateral = self.direction * (self.lateral + sum(c(t) for c in self.lat))
        xy = w.path.offset(s, lateral)
        ground = float(w.ground_height(xy[None])[0])
        z = ground + self.z_offset + self.height + sum(c(t) for c in self.z)
        heading = float(w.path.heading(s)) + (np.pi if self.direction < 0 else 0.0)
        yaw = heading + self.yaw_bias + sum(c(t) for c in self.yaw)
        pitch = sum(c(t) for c in self.pitch)
        roll = sum(c(t) for c in self.roll)
        T = np.eye(4)
        T[:3, :3] = _rot(yaw, pitch, roll) @ _rot(0.0, self.tilt, 0.0) @ R_BODY_CAM
        T[:3, 3] = (xy[0], xy[1], z)
        return T
