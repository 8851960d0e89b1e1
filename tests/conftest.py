"""Shared fixtures: tiny synthetic scenarios generated once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedepth.data.synth.generate import synthesize


@pytest.fixture(scope="session")
def smoke_hpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HPE scenario at the smoke profile (a few M3ED-format clients, tiny frames)."""
    root = tmp_path_factory.mktemp("smoke-hpe")
    return synthesize("hpe", "smoke", 0, root / "hpe", progress=False).parent


@pytest.fixture(scope="session")
def smoke_bmr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BMR scenario at the smoke profile (NYUv2 .mat + KITTI tree)."""
    root = tmp_path_factory.mktemp("smoke-bmr")
    return synthesize("bmr", "smoke", 0, root / "bmr", progress=False).parent
