"""Robot platforms and their sensor rigs: cameras, mounting, viewing angle and motion limits.

Every number models a property of the real platforms of M3ED (car, Spot, Falcon UAV), of the
handheld Kinect rig of NYUv2 and of KITTI's car. Where the datasets publish a value it is used
(KITTI's and NYUv2's intrinsics, KITTI's camera and LiDAR heights); where they do not, the value
is an order-of-magnitude property of the hardware and is marked as such.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedepth.data.camera import Camera, rigid

F64 = npt.NDArray[np.float64]

#: Prophesee EVK4 (IMX636): 1280 x 720. M3ED's build code projects depth over a ~62-64 deg
#: horizontal field of view ("The ec FoV is 62"), i.e. fx ~ 640 / tan(31.5 deg) ~ 1040 px.
EVENT_CAMERA = Camera(1280, 720, 1040.0, 1040.0, 640.0, 360.0, (-0.09, 0.12, 2e-4, -3e-4))
#: OVC 3b RGB (AR0144): 1280 x 800 with a wider lens (~72 deg horizontal: fx ~ 880 px). The exact
#: focal lengths of M3ED's Kalibr reports are not reproduced, only their order of magnitude.
OVC_RGB = Camera(1280, 800, 880.0, 880.0, 640.0, 400.0, (-0.12, 0.09, -3e-4, 2e-4))
#: KITTI colour camera 2 (rectified), 2011_09_26 calibration: 1242 x 375, f = 721.5377 px.
KITTI_CAM = Camera(1242, 375, 721.5377, 721.5377, 609.5593, 172.854)
#: NYU Depth v2 toolbox Kinect RGB intrinsics (camera_params.m), 640 x 480, images undistorted.
NYU_CAM = Camera(640, 480, 518.857901, 519.469611, 325.582449, 253.736166)
#: KITTI raw: per-date rectified calibrations (P_rect_02) differ in image size and focal length:
#: (width, height, f, cx, cy) of three recording days.
KITTI_DATES = {
    "2011_09_26": (1242, 375, 721.5377, 609.5593, 172.854),
    "2011_09_30": (1226, 370, 707.0912, 601.8873, 183.1104),
    "2011_10_03": (1241, 376, 718.8560, 607.1928, 185.2157),
}
#: KITTI sensor heights above the road: cameras 1.65 m, Velodyne HDL-64E 1.73 m.
KITTI_CAMERA_HEIGHT = 1.65
KITTI_LIDAR_HEIGHT = 1.73
#: HDL-64E vertical field of view: +2 deg to -24.8 deg.
KITTI_LIDAR_FOV_DEG = (2.0, -24.8)


@dataclass(frozen=True)
class Rig:
    """A sensor rig: the left event camera (depth ground truth frame) and the RGB camera, with
    the RGB camera's ``T_to_prophesee_left`` (RGB-frame points -> event-frame points)."""

    name: str
    event: Camera
    rgb: Camera
    T_event_rgb: F64

    def calibrated(self, key: str) -> Rig:
        """The rig as one calibration session measured it: focal lengths within +-1 %,
        principal points within +-6 px and distortion within +-10 % of nominal, extrinsics
        within +-0.3 deg / 3 mm (M3ED recalibrated per platform and environment group)."""
        rng = np.random.default_rng(zlib.crc32(f"{self.name}/{key}".encode()))

        def jitter(c: Camera) -> Camera:
            f = 1.0 + rng.uniform(-0.01, 0.01)
            k1, k2, p1, p2 = (float(x * rng.uniform(0.9, 1.1)) for x in c.dist)
            return Camera(
                c.width,
                c.height,
                c.fx * f,
                c.fy * f * (1 + rng.uniform(-2e-3, 2e-3)),
                c.cx + rng.uniform(-6, 6),
                c.cy + rng.uniform(-6, 6),
                (k1, k2, p1, p2),
            )

        a = rng.uniform(-0.3, 0.3, 3)
        t = rng.uniform(-0.003, 0.003, 3)
        dT = rigid(float(a[0]), float(a[1]), float(a[2]), (float(t[0]), float(t[1]), float(t[2])))
        return Rig(self.name, jitter(self.event), jitter(self.rgb), self.T_event_rgb @ dT)


#: M3ED's sensor tower (car and Spot share it): OVC RGB ~6 cm right of the left event camera.
TOWER = Rig("tower", EVENT_CAMERA, OVC_RGB, rigid(0.4, -0.6, 0.2, (0.06, 0.012, -0.004)))
#: The Falcon UAV carries its own, more compact rig.
FALCON_RIG = Rig("falcon", EVENT_CAMERA, OVC_RGB, rigid(-0.3, 0.5, -0.2, (0.045, -0.008, 0.003)))


@dataclass(frozen=True)
class Platform:
    """How a robot carries its camera and moves.

    ``height``: camera height above the ground (m); ``pitch``: downward camera tilt range (deg);
    ``speed``: travel speed range (m/s) per environment; ``motion``: the motion model
    (smooth / legged / uav / handheld, see :mod:`fedepth.data.synth.trajectory`);
    ``standoff``: the closest (m) the operator or the robot's obstacle avoidance lets the view
    come to what is in front: the median z-depth of the camera's view never drops below it.
    """

    name: str
    height: float
    pitch: tuple[float, float]
    speed: dict[str, tuple[float, float]]
    motion: str
    rig: Rig
    headlight: bool = False
    altitude: dict[str, tuple[float, float]] | None = None
    pitch_by_env: dict[str, tuple[float, float]] | None = None
    standoff: float = 1.0

    def speed_range(self, environment: str) -> tuple[float, float]:
        return self.speed.get(environment, self.speed["default"])

    def pitch_range(self, environment: str) -> tuple[float, float]:
        return (self.pitch_by_env or {}).get(environment, self.pitch)


PLATFORMS: dict[str, Platform] = {
    # M3ED car: tower on the roof rack, ~1.5 m; city traffic 15-35 km/h, forest tracks 7-18 km/h.
    "car": Platform(
        "car",
        1.5,
        (0.0, 3.0),
        {"default": (4.0, 10.0), "forest": (2.0, 5.0)},
        "smooth",
        TOWER,
        headlight=True,
        standoff=3.0,
    ),
    # Boston Dynamics Spot: body ~0.5-0.6 m, tower camera ~0.6 m; walks at up to 1.6 m/s. Its
    # obstacle avoidance keeps the body ~0.5 m from walls, the tower camera ~1 m behind the nose.
    "spot": Platform(
        "spot",
        0.6,
        (2.0, 8.0),
        {"default": (0.8, 1.5), "indoor": (0.5, 1.1)},
        "legged",
        TOWER,
        standoff=1.0,
    ),
    # Falcon 450 quadrotor: camera pitched down while flying forward; 2-30 m above ground
    # outdoors (below the canopy along forest roads), 1-2 m indoors. Over open ground it looks
    # 15-40 deg down; low under trees and indoors, where obstacles are ahead, 5-20 deg.
    "falcon": Platform(
        "falcon",
        0.0,
        (15.0, 40.0),
        {"default": (2.0, 6.0), "indoor": (0.4, 1.2), "forest": (1.5, 4.0)},
        "uav",
        FALCON_RIG,
        altitude={
            "urban_day": (5.0, 30.0),
            "urban_night": (5.0, 30.0),
            "forest": (2.0, 6.0),
            "indoor": (1.0, 1.8),
        },
        pitch_by_env={"forest": (5.0, 20.0), "indoor": (5.0, 20.0)},
        # a pilot keeps a quadrotor's 0.45 m frame and its propellers clear of walls
        standoff=1.0,
    ),
    # A person holding the camera at chest/eye height (~1.5 m), walking 0.5-1.1 m/s, looking
    # slightly down and around (indoors further down, at furniture); NYUv2 was recorded this
    # way with a handheld Kinect.
    "handheld": Platform(
        "handheld",
        1.5,
        (5.0, 25.0),
        {"default": (0.5, 1.1)},
        "handheld",
        TOWER,
        pitch_by_env={"indoor": (10.0, 35.0)},
        # the Kinect's depth starts at ~0.5 m; NYUv2's frames keep a room's furniture in view
        standoff=0.8,
    ),
}
