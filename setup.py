"""Packaging for fedepth: one ament_python package (fedepth_ros) that also installs with pip.

The same file serves `colcon build` on a robot (ament resource marker, package.xml, launch and
config files under share/fedepth_ros) and `pip install -e .` in a virtualenv, which is how the
repository builds and tests.
"""

from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "fedepth_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    description="Federated monocular depth estimation for heterogeneous robot fleets (FeDepth)",
    long_description=Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(
        include=[
            "fedepth",
            "fedepth.*",
            "fedepth_cli",
            "fedepth_cli.*",
            "fedepth_coordinator",
            "fedepth_coordinator.*",
            "fedepth_ros",
            "fedepth_ros.*",
            # the optional Flower bridge; its flwr comes from requirements-flower.txt
            "fedepth_flower",
            "fedepth_flower.*",
        ]
    ),
    package_data={
        "fedepth": ["py.typed"],
        "fedepth_cli": ["py.typed"],
        "fedepth_coordinator": ["py.typed"],
        "fedepth_flower": ["py.typed"],
        "fedepth_ros": ["fastdds_large_data.xml"],
    },
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    install_requires=[
        "numpy",
        "scipy",
        "torch",
        "torchvision",
        "safetensors",
        "pyyaml",
        "tqdm",
        "rosbags>=0.10",
        "grpcio",
        "grpcio-health-checking",
        "grpcio-reflection",
        "protobuf",
    ],
    zip_safe=True,
    maintainer="fedepth developers",
    maintainer_email="fedepth@example.org",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "fedepth = fedepth_cli.main:main",
            "bag_player = fedepth_ros.bag_player:main",
            "robot_node = fedepth_ros.robot_node:main",
            "depth_node = fedepth_ros.depth_node:main",
            "depth_scorer = fedepth_ros.depth_scorer:main",
            "fedepth-coordinator = fedepth_coordinator.cli:main",
        ],
    },
)
