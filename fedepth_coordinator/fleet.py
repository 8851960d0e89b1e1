"""The fleet registry: registration, descriptors and data summaries, and their validation.

A robot registers (id, sample count, labels, optionally the card of the model it runs) and
uploads its descriptor with the summaries the strategy asked for. Everything is checked before
it is stored: ids, labels, the declared model card against the served one, the descriptor
against the fleet's (dimension, range, finite divergences), summaries (size, finite values,
PACFL's basis). A member's registration and descriptor cannot change during a run. Changes go
to a :class:`FleetFormation`, which forms the fleet or lets the robot join it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import numpy as np

from fedepth.clustering import jeffreys_cross
from fedepth.descriptor import Descriptor, check_descriptor
from fedepth.strategies.pacfl import BASIS_KEY as PACFL_BASIS
from fedepth_coordinator.coordstate import CoordinatorState, check_caller, log
from fedepth_coordinator.domain import DescriptorAck, Registration
from fedepth_coordinator.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    shown,
)
from fedepth_coordinator.state.base import ID_PATTERN, RobotRecord, valid_id

MAX_LABELS = 16
MAX_LABEL_CHARS = 128


class FleetFormation(Protocol):
    """What the registry tells of fleet changes (:class:`~fedepth_coordinator.formation.
    Formation`)."""

    def check_not_forming(self, robot_id: str) -> None: ...  # lock held; raises ABORTED

    def after_fleet_change(self, robot_id: str) -> None: ...  # lock held

    def form_fleet(self) -> None: ...  # lock not held


def check_labels(labels: Mapping[str, str], what: str) -> None:
    if len(labels) > MAX_LABELS:
        raise InvalidArgumentError(f"{what}: at most {MAX_LABELS} labels, got {len(labels)}")
    for k, v in labels.items():
        if not k or len(k) > MAX_LABEL_CHARS or len(v) > MAX_LABEL_CHARS:
            raise InvalidArgumentError(
                f"{what}: label {k[:20]!r} must be non-empty and keys and values at most "
                f"{MAX_LABEL_CHARS} characters"
            )


def same_descriptor(a: Descriptor | None, b: Descriptor | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        a.num_frames == b.num_frames
        and np.array_equal(a.mean, b.mean)
        and np.array_equal(a.var, b.var)
    )


def same_summaries(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class FleetRegistry:
    """The robots of the fleet: what they registered and sent, checked."""

    def __init__(
        self,
        state: CoordinatorState,
        formation: FleetFormation,
        *,
        summaries_wanted: tuple[str, ...],
        strategy_name: str,
    ) -> None:
        self._state = state
        self._formation = formation
        #: the data summaries the strategy needs besides the descriptor
        self.summaries_wanted = summaries_wanted
        self._strategy_name = strategy_name

    # -- calls -------------------------------------------------------------------------------
    def register(
        self,
        caller: str,
        robot_id: str,
        num_samples: int,
        labels: Mapping[str, str],
        *,
        model_card: str | None = None,
    ) -> Registration:
        s = self._state
        check_caller(caller, robot_id)
        if not valid_id(robot_id):
            raise InvalidArgumentError(
                f"robot id {shown(robot_id)} must match {ID_PATTERN.pattern}"
            )
        if num_samples <= 0:
            raise InvalidArgumentError(f"num_samples must be > 0, got {num_samples}")
        check_labels(labels, f"robot {robot_id!r}")
        if model_card is not None:
            self.check_model_card(robot_id, model_card)
        with s.cond:
            s.touch(robot_id)
            old = s.robots.get(robot_id)
            if old is not None and robot_id in s.member_set:
                if old.num_samples != num_samples or dict(old.labels) != dict(labels):
                    raise FailedPreconditionError(
                        f"robot {robot_id!r} joined the run with num_samples={old.num_samples} "
                        f"and labels {dict(old.labels)}; registration data cannot change "
                        "during a run (re-register with the same values)"
                    )
            elif old is None or old.num_samples != num_samples or dict(old.labels) != dict(labels):
                self._formation.check_not_forming(robot_id)
                new = RobotRecord(
                    robot_id,
                    num_samples,
                    dict(labels),
                    descriptor=None if old is None else old.descriptor,
                    summaries={} if old is None else old.summaries,
                )
                s.store.put_robot(new)
                s.robots[robot_id] = new
                log.info("robot %s registered (%d samples, %s)", robot_id, num_samples, labels)
                self._formation.after_fleet_change(robot_id)
        self._formation.form_fleet()  # outside the lock: formation work may be long
        with s.cond:
            return Registration(
                s.phase, robot_id in s.member_set, s.model_card, self.summaries_wanted
            )

    def upload_descriptor(
        self,
        caller: str,
        robot_id: str,
        descriptor: Descriptor,
        summaries: Mapping[str, np.ndarray],
    ) -> DescriptorAck:
        s = self._state
        check_caller(caller, robot_id)
        self.check_summary_values(summaries)
        missing = [k for k in self.summaries_wanted if k not in summaries]
        if missing:
            raise InvalidArgumentError(
                f"strategy {self._strategy_name} needs the summaries {missing} with the "
                "descriptor (RegisterReply.summaries names them): send them in this "
                "UploadDescriptor; fedepth_coordinator.robot.run_robot does"
            )
        # what the strategy did not ask for is not kept: the coordinator stores no more of a
        # robot's data than its algorithm uses
        summaries = {k: v for k, v in summaries.items() if k in self.summaries_wanted}
        with s.cond:
            old = s.robot(robot_id)
            s.touch(robot_id)
            self.check_descriptor(robot_id, descriptor)
            self.check_summaries(descriptor, summaries)
            if robot_id in s.member_set:
                if not (
                    same_descriptor(old.descriptor, descriptor)
                    and same_summaries(old.summaries, summaries)
                ):
                    raise FailedPreconditionError(
                        f"robot {robot_id!r} is already clustered by its descriptor; it cannot "
                        "change during a run"
                    )
            else:
                self._formation.check_not_forming(robot_id)
                new = replace(old, descriptor=descriptor, summaries=dict(summaries))
                s.store.put_robot(new)
                s.robots[robot_id] = new
                self._formation.after_fleet_change(robot_id)
        self._formation.form_fleet()  # outside the lock: formation work (PACFL's SVDs) may be long
        with s.cond:
            return DescriptorAck(s.phase, robot_id in s.member_set, s.clusters_of(robot_id))

    # -- checks ------------------------------------------------------------------------------
    def check_model_card(self, robot_id: str, declared_json: str) -> None:
        """Refuse a robot whose declared model cannot take the served weights."""
        from fedepth.models.card import ModelCard

        try:
            declared = ModelCard.from_json(declared_json, f"robot {robot_id!r}'s model card")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        served_json = self._state.model_card
        if served_json is None:
            raise FailedPreconditionError(
                f"robot {robot_id!r} declares {declared.describe()}, but this coordinator "
                "serves a model without a card (the synthetic test model): no robot model "
                "can take it"
            )
        served = ModelCard.from_json(served_json, "served model")
        diff = served.differences(declared)
        if diff:
            raise FailedPreconditionError(
                f"robot {robot_id!r} declares {declared.describe()}, but this coordinator "
                f"serves {served.describe()} (differs in {', '.join(diff)}): start the robot "
                "without weights (it builds the served model) or with weights of that model"
            )

    def check_descriptor(self, robot_id: str, d: Descriptor) -> None:
        """A descriptor the fleet can cluster (lock held; ``robot_id`` "" for none)."""
        s = self._state
        v = s.config.validation
        if d.dim == 0 or d.dim > v.max_descriptor_dim:
            raise InvalidArgumentError(
                f"descriptor has {d.dim} dimensions; it needs 1 to {v.max_descriptor_dim}"
            )
        try:
            check_descriptor(d.mean, d.var, d.num_frames)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        dim = s.expected_dim()
        if dim is not None and d.dim != dim:
            raise InvalidArgumentError(
                f"descriptor has {d.dim} dimensions but the fleet's have {dim}: compute it "
                "with the same encoder as the other robots"
            )
        bound = v.descriptor_bound
        if not (
            np.abs(d.mean).max() <= bound and 1 / bound <= d.var.min() <= d.var.max() <= bound
        ):
            raise InvalidArgumentError(
                f"descriptor out of range: means must lie in [-{bound:g}, {bound:g}] and "
                f"variances in [{1 / bound:g}, {bound:g}] (validation.descriptor_bound)"
            )
        others = [
            r.descriptor
            for rid, r in s.robots.items()
            if rid != robot_id and r.descriptor is not None and r.descriptor.dim == d.dim
        ]
        if others:
            with np.errstate(all="ignore"):
                div = jeffreys_cross(
                    d.mean[None],
                    d.var[None],
                    np.stack([o.mean for o in others]),
                    np.stack([o.var for o in others]),
                )
            if not np.isfinite(div).all():
                raise InvalidArgumentError(
                    "descriptor's divergence to the fleet's is not finite: it cannot be clustered"
                )

    def check_summary_values(self, summaries: Mapping[str, np.ndarray]) -> None:
        """Inline summaries (descriptor uploads and Route alike): bounded size, finite."""
        most = self._state.config.validation.max_summary_bytes
        size = sum(np.asarray(a).nbytes for a in summaries.values())
        if size > most:
            raise ResourceExhaustedError(
                f"summaries take {size} bytes; at most {most} are accepted "
                "(validation.max_summary_bytes)"
            )
        for name, arr in summaries.items():
            if np.asarray(arr).dtype.kind == "f" and not np.isfinite(arr).all():
                raise InvalidArgumentError(f"summary {shown(name)} contains NaN or Inf")

    def check_summaries(self, d: Descriptor, summaries: Mapping[str, np.ndarray]) -> None:
        """The summaries' shapes against the descriptor (PACFL's basis)."""
        basis = summaries.get(PACFL_BASIS)
        if basis is None:
            return
        b = np.asarray(basis)
        if b.ndim != 2 or b.shape[0] != d.dim or not 1 <= b.shape[1] <= d.dim:
            raise InvalidArgumentError(
                f"summary {PACFL_BASIS!r} must be a D x p basis with D = {d.dim} (the "
                f"descriptor's dimension) and 1 <= p <= D, got shape {list(b.shape)}"
            )
        most = self._state.config.validation.max_basis_columns
        if b.shape[1] > most:
            # formation costs N^2 SVDs of p x p products (D p^2 each): p is what bounds it
            raise InvalidArgumentError(
                f"summary {PACFL_BASIS!r} has {b.shape[1]} columns; at most {most} are "
                "accepted (validation.max_basis_columns)"
            )
        if b.dtype.kind != "f":
            raise InvalidArgumentError(f"summary {PACFL_BASIS!r} must be floating point")
        b = b.astype(np.float64)
        gram = np.einsum("ij,ik->jk", b, b)
        if not np.allclose(gram, np.eye(b.shape[1]), atol=1e-3):
            raise InvalidArgumentError(
                f"summary {PACFL_BASIS!r} must have orthonormal columns "
                "(fedepth.clustering.subspace_basis)"
            )
