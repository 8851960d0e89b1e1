"""The checks every client update passes before it may touch an aggregate: the one owner.

An update is rejected when a floating tensor holds a NaN or Inf (:func:`first_nonfinite`,
:func:`nonfinite_message`), or when it breaks a norm bound (:class:`UpdateBounds`): the L2
distance of its state to the model it was trained from, and the L2 norm of each extra group
(SCAFFOLD's control delta and the like: deltas), each at most its bound.

The coordinator runs these rules on every upload as its bytes stream in
(``fedepth_coordinator.tensors.StreamChecker``, which adds the wire's own checks: byte counts,
names and shapes against the task; it sums the squared norms chunk by chunk and asks
:meth:`UpdateBounds.check` for the verdict); the in-process round driver
(:class:`fedepth.rounds.RoundDriver`) runs :func:`check_update` on every client update and
leaves a rejected one out of the round, as a coordinator does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

#: The name of an update's model state among its tensor groups (the others are its extras).
STATE = "state"

#: Exponent bits of the float dtypes whose finiteness is tested on their bits: numpy's isfinite
#: on float16 is an order of magnitude slower than this mask (all ones: Inf or NaN).
_EXPONENT_MASKS: dict[np.dtype, tuple[np.dtype, int]] = {
    np.dtype("<f2"): (np.dtype("<u2"), 0x7C00),
}


class UpdateRejectedError(ValueError):
    """An update that may not touch an aggregate; the message says why (one line)."""


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


def nonfinite_message(group: str, name: str, element: int) -> str:
    """Why an update with a NaN or Inf at ``element`` (flat) of ``group/name`` is rejected."""
    return (
        f"tensor {group}/{name} has a NaN or Inf value (element {element}); "
        "the update was rejected: check the robot's training for divergence"
    )


@dataclass(frozen=True)
class UpdateBounds:
    """Norm bounds of an update (None, and no group bound: unbounded, the default).

    ``max_norm`` bounds the L2 distance of the state to the model the client downloaded and the
    L2 norm of every extra group; ``group_norms`` bounds groups by name (``state`` included)
    and overrides ``max_norm``. ``settings`` names where the bounds were configured, for the
    rejection message.
    """

    max_norm: float | None = None
    group_norms: Mapping[str, float] = field(default_factory=dict)
    settings: str = "max_update_norm, max_group_norms"

    def __post_init__(self) -> None:
        if self.max_norm is not None and not self.max_norm > 0:
            raise ValueError(f"max_update_norm must be > 0 or None, got {self.max_norm!r}")
        for name, bound in self.group_norms.items():
            if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0:
                raise ValueError(f"max_group_norms.{name} must be a number > 0, got {bound!r}")

    @property
    def active(self) -> bool:
        """Whether any group is bounded."""
        return self.max_norm is not None or bool(self.group_norms)

    def bound(self, group: str) -> float | None:
        """The bound of ``group`` (None: unbounded)."""
        return self.group_norms.get(group, self.max_norm)

    def check(self, sq_norms: Mapping[str, float]) -> None:
        """Raise :class:`UpdateRejectedError` for the first group (in ``sq_norms``' order) whose
        norm (the square root of its squared L2 norm; the state's: its distance to the
        reference) exceeds its bound. An overflow to inf is over every bound."""
        for group, sq in sq_norms.items():
            bound = self.bound(group)
            if bound is None:
                continue
            norm = math.sqrt(sq)
            if not norm <= bound:
                what = "update norm" if group == STATE else f"norm of extra group {group!r}"
                raise UpdateRejectedError(
                    f"{what} {norm:.4g} exceeds the bound {bound:.4g} ({self.settings})"
                )


def _sq_norm(values: np.ndarray, reference: np.ndarray | None = None) -> float:
    flat = values.reshape(-1)
    diff = (
        flat.astype(np.float64)
        if reference is None
        else np.subtract(flat, reference.reshape(-1), dtype=np.float64)
    )
    # einsum, not np.dot: BLAS threads for one dot product are slow on a busy machine
    return float(np.einsum("i,i->", diff, diff))


def check_update(
    state: Mapping[str, np.ndarray],
    extra: Mapping[str, Mapping[str, np.ndarray]],
    *,
    reference: Mapping[str, np.ndarray],
    bounds: UpdateBounds | None = None,
) -> None:
    """Raise :class:`UpdateRejectedError` unless an update (its ``state`` and ``extra`` groups) may
    touch an aggregate: every floating tensor finite, then every bounded group within its
    bound (the state measured from ``reference``, the model the client trained from). The
    coordinator applies the same rules to the upload's bytes as they stream."""
    groups = {STATE: state, **extra}
    for group, tensors in groups.items():
        for name, arr in tensors.items():
            bad = first_nonfinite(np.asarray(arr))
            if bad is not None:
                raise UpdateRejectedError(nonfinite_message(group, name, bad))
    if bounds is None or not bounds.active:
        return
    sq: dict[str, float] = {}
    for group, tensors in groups.items():
        if bounds.bound(group) is None:
            continue
        sq[group] = 0.0
        for name, arr in tensors.items():
            a = np.asarray(arr)
            if a.dtype.kind != "f":
                continue
            ref = np.asarray(reference[name]) if group == STATE else None
            sq[group] += _sq_norm(a, ref)
    bounds.check(sq)
