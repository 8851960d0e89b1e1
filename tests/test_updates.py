"""fedepth.updates: the update checks (finite values, norm bounds) the coordinator and the
in-process round driver share."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.updates import (
    STATE,
    UpdateBounds,
    UpdateRejectedError,
    check_update,
    first_nonfinite,
    nonfinite_message,
)


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


def test_bounds_default_off_and_group_bounds_override_the_global_one() -> None:
    assert not UpdateBounds().active
    b = UpdateBounds(2.0, {"cv": 0.5})
    assert b.active and b.bound(STATE) == 2.0 and b.bound("cv") == 0.5 and b.bound("x") == 2.0
    assert UpdateBounds(None, {"cv": 0.5}).bound(STATE) is None
    for bad in ({"cv": 0.0}, {"cv": "1"}, {"cv": True}):
        with pytest.raises(ValueError, match=r"max_group_norms\.cv must be a number > 0"):
            UpdateBounds(None, bad)
    with pytest.raises(ValueError, match="max_update_norm must be > 0"):
        UpdateBounds(-1.0)


def test_bounds_check_names_the_group_its_norm_and_the_settings() -> None:
    b = UpdateBounds(5.0, settings="cfg.max")
    b.check({STATE: 25.0, "cv": 0.0})  # a norm equal to its bound passes
    with pytest.raises(UpdateRejectedError, match=r"^update norm 5.1 exceeds the bound 5 \(cfg"):
        b.check({STATE: 5.1**2})
    with pytest.raises(UpdateRejectedError, match="norm of extra group 'cv' inf exceeds"):
        b.check({STATE: 1.0, "cv": float("inf")})


def test_check_update_measures_the_state_from_the_reference_and_extras_from_zero() -> None:
    reference = {"w": np.zeros((2, 2), np.float32), "n": np.array(3, np.int64)}
    state = {"w": np.full((2, 2), 1.5, np.float32), "n": np.array(4, np.int64)}  # distance 3
    extra = {"cv": {"w": np.full((2, 2), 0.5, np.float32)}}  # norm 1
    check_update(state, extra, reference=reference)  # no bounds: only finiteness
    check_update(state, extra, reference=reference, bounds=UpdateBounds(3.0))
    with pytest.raises(UpdateRejectedError, match=r"update norm 3 exceeds the bound 2\.9"):
        check_update(state, extra, reference=reference, bounds=UpdateBounds(2.9))
    with pytest.raises(UpdateRejectedError, match=r"extra group 'cv' 1 exceeds the bound 0\.9"):
        check_update(state, extra, reference=reference, bounds=UpdateBounds(None, {"cv": 0.9}))
    # the reference is subtracted: a state far from zero but at the reference is within bounds
    check_update(reference, {}, reference=reference, bounds=UpdateBounds(1e-9))


def test_check_update_rejects_nan_first_with_the_coordinators_message() -> None:
    reference = {"w": np.zeros(4, np.float16)}
    bad = {"w": np.array([0, 0, np.nan, 0], np.float16)}
    with pytest.raises(UpdateRejectedError) as err:
        check_update(bad, {}, reference=reference, bounds=UpdateBounds(1.0))
    assert str(err.value) == nonfinite_message(STATE, "w", 2)
    assert "state/w has a NaN or Inf value (element 2)" in str(err.value)
    with pytest.raises(UpdateRejectedError, match="cv/w has a NaN or Inf value"):
        check_update(reference, {"cv": {"w": np.array([np.inf], np.float32)}}, reference=reference)
