"""fedepth.updates: the finiteness check the coordinator and the simulation share."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.updates import first_nonfinite


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_first_nonfinite_finds_the_first_nan_or_inf_in_flat_order(dtype: type) -> None:
    values = np.ones(10, dtype)
    assert first_nonfinite(values) is None
    values[7], values[9] = np.inf, np.nan
    assert first_nonfinite(values) == 7
    grid = np.ones((3, 4), dtype)
    grid[2, 1] = -np.inf
    assert first_nonfinite(grid) == 9


def test_first_nonfinite_ignores_what_cannot_hold_nan() -> None:
    assert first_nonfinite(np.arange(3)) is None
    assert first_nonfinite(np.zeros(0, np.float32)) is None
