"""The checks every client update passes before it may touch an aggregate.

The coordinator runs them on every upload as its bytes stream in
(``fedepth_coordinator.tensors.StreamChecker``, which adds the wire's own checks: byte counts,
names and shapes against the task, norm bounds); the in-process simulation runs them on every
client update (``fedepth.sim.wire``) and leaves a rejected one out of the round, as a
coordinator would.
"""

from __future__ import annotations

import numpy as np

#: Exponent bits of the float dtypes whose finiteness is tested on their bits: numpy's isfinite
#: on float16 is an order of magnitude slower than this mask (all ones: Inf or NaN).
_EXPONENT_MASKS: dict[np.dtype, tuple[np.dtype, int]] = {
    np.dtype("<f2"): (np.dtype("<u2"), 0x7C00),
}


def first_nonfinite(values: np.ndarray) -> int | None:
    """The flat index of the first NaN or Inf of a floating array, None when all are finite
    (and for arrays that are not floating)."""
    if values.dtype.kind != "f" or values.size == 0:
        return None
    mask = _EXPONENT_MASKS.get(values.dtype)
    if mask is not None:
        bits, exponent = mask
        if int(np.bitwise_and(values.reshape(-1).view(bits), exponent).max()) != exponent:
            return None
    elif bool(np.isfinite(values).all()):
        return None
    return int(np.flatnonzero(~np.isfinite(values.reshape(-1)))[0])
