"""The layers hold at run time: importing every module of a package loads nothing above it.

``fedepth`` (the core library) loads neither gRPC, protobuf, ROS nor Flower, nor the packages
built on it; ``fedepth_coordinator`` loads no ROS, no Flower and neither the nodes nor the
command line. Each check runs in a fresh interpreter, so that nothing this test process
imported earlier hides a load.
The same rules, as import contracts over the source, are checked by ``lint-imports``
(``[tool.importlinter]`` in pyproject.toml, run by ``make lint`` and ``make test``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: package -> top-level modules that importing all of it must not load
FORBIDDEN = {
    "fedepth": (
        "grpc",
        "grpc_health",
        "grpc_reflection",
        "google.protobuf",
        "rclpy",
        "sensor_msgs",
        "std_msgs",
        "builtin_interfaces",
        "fedepth_coordinator",
        "fedepth_ros",
        "fedepth_cli",
        "fedepth_flower",
        "flwr",
    ),
    "fedepth_coordinator": (
        "rclpy",
        "sensor_msgs",
        "std_msgs",
        "fedepth_ros",
        "fedepth_cli",
        "fedepth_flower",
        "flwr",
    ),
}

#: imports every module of the package named by argv[1] (``__main__`` modules would run
#: their command), then prints the modules it imported and what of argv[2:] got loaded
PROBE = """
import importlib, json, pkgutil, sys
package, forbidden = sys.argv[1], sys.argv[2:]
root = importlib.import_module(package)
names = [package]
for info in pkgutil.walk_packages(root.__path__, package + "."):
    if info.name.rsplit(".", 1)[-1] != "__main__":
        importlib.import_module(info.name)
        names.append(info.name)
loaded = [f for f in forbidden if f in sys.modules]
print(json.dumps({"imported": names, "loaded": loaded}))
"""


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_loads_no_higher_layer(package: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, package, *FORBIDDEN[package]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found["imported"]) > 10, found["imported"]  # the walk did find the package
    assert found["loaded"] == [], f"importing {package} loaded {found['loaded']}"


#: modules whose processes never run a network, so must not pay torch's import (seconds of
#: CPU per process: a fleet replay starts a bag_player with every robot it (re)starts)
TORCH_FREE = (
    "fedepth.recipe",
    "fedepth.optconfig",
    "fedepth_ros.params",
    "fedepth_ros.bag_player",
)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_modules_that_run_no_network_do_not_import_torch(module: str) -> None:
    probe = f"import sys, {module}; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False", f"importing {module} loaded torch"
