"""Fixtures of the data tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from handmade_datasets import write_m3ed_pair


@pytest.fixture
def m3ed_pair(tmp_path: Path) -> tuple[Path, Path]:
    return write_m3ed_pair(tmp_path)
