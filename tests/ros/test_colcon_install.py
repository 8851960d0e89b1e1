"""The colcon-style install of the fedepth_ros package: executables and share files where the
launch files look for them, and every runtime dependency declared (rosdep key or pip file).

colcon builds an ament_python package with ``setup.py install --single-version-externally-
managed`` into ``install/<package>``; setup.cfg moves the console scripts to
``lib/<package>`` (where ``ros2 run`` and launch_ros look). This test runs that install into a
temporary prefix and resolves every executable and share path the launch files use there.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .test_launch_files import MODELS, ROOT, _console_scripts, _kw, _name, _package_name

#: what colcon's ament_python build needs from the source tree
SOURCES = ("setup.py", "setup.cfg", "package.xml", "README.md", "resource", "launch", "config")
PACKAGES = ("fedepth", "fedepth_cli", "fedepth_coordinator", "fedepth_ros")
#: pip name -> rosdep key (rosdistro rosdep/python.yaml) of the dependencies that have one
ROSDEP_KEYS = {
    "numpy": "python3-numpy",
    "scipy": "python3-scipy",
    "pyyaml": "python3-yaml",
    "tqdm": "python3-tqdm",
    "grpcio": "python3-grpcio",
    "protobuf": "python3-protobuf",
}


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~\[; ]", spec.strip(), maxsplit=1)[0].lower()


def _install_requires() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [_requirement_name(s) for s in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no install_requires")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``setup.py install`` as colcon runs it, from a copy of the sources (the build leaves
    build/ and *.egg-info behind), into <tmp>/root/ws/install/fedepth_ros."""
    tmp = tmp_path_factory.mktemp("colcon")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in (*SOURCES, *PACKAGES):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    root, install = tmp / "root", "/ws/install/fedepth_ros"
    argv = [sys.executable, "setup.py", "install", "--single-version-externally-managed"]
    argv += ["--root", str(root), "--prefix", install, "--record", str(tmp / "files.txt")]
    done = subprocess.run(argv, cwd=src, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root / install.lstrip("/")


def test_every_launch_executable_is_installed_in_lib_package(prefix: Path) -> None:
    package = _package_name()
    used: set[str] = set()
    for name, model in MODELS.items():
        for call in model.nodes:
            assert model.value(_kw(call, "package")) == package
            used.add(str(model.value(_kw(call, "executable"))))
        for call in model.processes:
            cmd = _kw(call, "cmd")
            assert isinstance(cmd, ast.List)
            first = cmd.elts[0]
            assert isinstance(first, ast.Call) and _name(first.func) == "PathJoinSubstitution"
            parts = first.args[0]
            assert isinstance(parts, ast.List)
            *_, lib, pkg, exe = [model.value(e) for e in parts.elts]
            assert (lib, pkg) == ("lib", package), f"{name}: {lib}/{pkg}"
            used.add(str(exe))
    assert used == {
        "robot_node",
        "depth_node",
        "bag_player",
        "depth_scorer",
        "fedepth-coordinator",
    }
    for exe in used | set(_console_scripts()):
        path = prefix / "lib" / package / exe
        assert path.is_file() and os.access(path, os.X_OK), f"{path} missing or not executable"
    assert not (prefix / "bin").exists(), "console scripts must go to lib/<package>, not bin"


def test_every_share_path_of_the_launch_files_is_installed(prefix: Path) -> None:
    share = prefix / "share" / _package_name()
    checked = 0
    for name, model in MODELS.items():
        for parts in model.share_paths:
            if parts[:1] in (("config",), ("launch",)):
                assert (share.joinpath(*parts)).is_file(), f"{name}: share/{'/'.join(parts)}"
                checked += 1
    assert checked >= 5  # each node's parameter file and the included robot.launch.py
    assert (share / "package.xml").is_file()
    marker = prefix / "share" / "ament_index" / "resource_index" / "packages" / _package_name()
    assert marker.is_file(), "no ament index marker: FindPackageShare would not find the package"


def test_the_installed_coordinator_runs_from_the_prefix(prefix: Path, tmp_path: Path) -> None:
    site = next(prefix.glob("lib/python3*/site-packages"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    exe = prefix / "lib" / _package_name() / "fedepth-coordinator"
    done = subprocess.run(
        [str(exe), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "--config" in done.stdout, done.stderr
    where = subprocess.run(
        [sys.executable, "-c", "import fedepth_coordinator as m; print(m.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(where.stdout.strip()).is_relative_to(site), where


def test_the_installed_fedepth_command_writes_and_reads_a_bag(
    prefix: Path, tmp_path: Path
) -> None:
    """`fedepth` (fedepth_cli) and the bag code it drives (fedepth.data) are installed."""
    site = next(prefix.glob("lib/python3*/site-packages"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    exe = str(prefix / "lib" / _package_name() / "fedepth")
    for argv in (
        [exe, "bag", "test-scene", "--out", "b", "--frames", "2", "--no-progress"],
        [exe, "bag", "info", "b", "--json"],
    ):
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
    assert '"message_count": 6' in done.stdout, done.stdout


def test_every_runtime_dependency_has_a_rosdep_key_or_a_pip_requirement() -> None:
    xml = (ROOT / "package.xml").read_text()
    depends = set(re.findall(r"<exec_depend>(.+?)</exec_depend>", xml))
    pip = {
        _requirement_name(line)
        for line in (ROOT / "requirements-ros.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for req in _install_requires():
        key = ROSDEP_KEYS.get(req)
        assert (key is not None and key in depends) or req in pip, (
            f"{req}: neither its rosdep key in package.xml nor in requirements-ros.txt"
        )
        assert not (key is not None and req in pip), f"{req}: both a rosdep key and pip"
    # every pip-only requirement carries the version this repository is tested with
    tested = {
        _requirement_name(line): line.strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for line in (ROOT / "requirements-ros.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert tested.get(_requirement_name(line)) == line.strip(), line
    # the ROS packages the nodes and launch files import
    assert {"rclpy", "sensor_msgs", "std_msgs", "diagnostic_msgs", "launch", "launch_ros"} <= (
        depends
    )


def test_the_fast_dds_profile_is_installed_beside_the_module_that_loads_it(prefix: Path) -> None:
    found = list(prefix.rglob("fedepth_ros/fastdds_large_data.xml"))
    assert len(found) == 1 and (found[0].parent / "dds.py").is_file(), found
