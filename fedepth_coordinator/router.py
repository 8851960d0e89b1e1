"""The router and the coordinator's views: Route for unseen sequences, the cluster map, the
fleet status (with each cluster's composition by the labels robots declared) and the members'
current models."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from fedepth import composition
from fedepth.descriptor import Descriptor
from fedepth.models.state import State
from fedepth.strategies import ClusteredStrategy, RouteDecision
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.domain import (
    ClusterComposition,
    ClusterMap,
    CoMemberShares,
    FleetStatus,
    RobotStatus,
    RoundSummary,
    RouteHeader,
    RouteStream,
)
from fedepth_coordinator.errors import FailedPreconditionError, InvalidArgumentError
from fedepth_coordinator.tensors import STATE, Layout
from fedepth_coordinator.transfers import TransferSlots


class DescriptorChecks(Protocol):
    """The registry's checks a routed descriptor passes too
    (:class:`~fedepth_coordinator.fleet.FleetRegistry`)."""

    def check_descriptor(self, robot_id: str, d: Descriptor) -> None: ...  # lock held

    def check_summary_values(self, summaries: Mapping[str, np.ndarray]) -> None: ...


class Router:
    """Routes unseen sequences through the strategy; reports the fleet."""

    def __init__(
        self, state: CoordinatorState, checks: DescriptorChecks, transfers: TransferSlots
    ) -> None:
        self._state = state
        self._checks = checks
        self._transfers = transfers

    def route(
        self,
        caller: str,
        descriptor: Descriptor | None,
        *,
        include_model: bool,
        labels: Mapping[str, str] | None = None,
        summaries: Mapping[str, np.ndarray] | None = None,
    ) -> RouteStream:
        """The clusters serving an unseen sequence and, optionally, their averaged model."""
        s = self._state
        self._checks.check_summary_values(summaries or {})
        with s.cond:
            if caller in s.robots:
                s.touch(caller)
            strategy = s.require_strategy()
            if descriptor is not None:
                self._checks.check_descriptor("", descriptor)
            route_fn: Callable[..., RouteDecision] = strategy.route
            kwargs: dict[str, Any] = {}
            accepted = inspect.signature(route_fn).parameters
            for name, value in (("labels", labels), ("extra", summaries)):
                if value:
                    if name not in accepted:
                        raise FailedPreconditionError(
                            f"strategy {strategy.name} routes by descriptor only; drop {name}"
                        )
                    kwargs[name] = dict(value)
            try:
                decision = route_fn(descriptor, **kwargs)
            except ValueError as exc:
                raise InvalidArgumentError(f"cannot route: {exc}") from exc
        layout = Layout.of({STATE: decision.state}) if include_model else None
        header = RouteHeader(
            tuple(int(k) for k in decision.clusters),
            tuple(float(w) for w in decision.weights),
            layout,
        )
        return RouteStream(
            header, self._transfers.payload([decision.state] if include_model else [], caller)
        )

    def cluster_map(self) -> ClusterMap:
        s = self._state
        with s.cond:
            strategy = s.strategy
            name = s.config.strategy.name
            if not isinstance(strategy, ClusteredStrategy):
                return ClusterMap(clustered=False, strategy=name)
            ids = [c.cid for c in strategy.clients]
            clusters = tuple(
                tuple(ids[int(j)] for j in np.flatnonzero(row)) for row in strategy.M_star
            )
            tau = getattr(strategy, "tau", None)
            return ClusterMap(True, name, None if tau is None else float(tau), clusters)

    def fleet_status(self) -> FleetStatus:
        s = self._state
        with s.cond:
            now = time.monotonic()
            r = s.open_round
            selected = set(r.record.selected) if r else set()
            counts: dict[str, int] = {}
            for h in s.history:
                for rid in h.reported:
                    counts[rid] = counts.get(rid, 0) + 1
            robots = tuple(
                RobotStatus(
                    robot_id=rid,
                    num_samples=rec.num_samples,
                    labels=dict(rec.labels),
                    has_descriptor=rec.descriptor is not None,
                    member=rid in s.member_set,
                    clusters=s.clusters_of(rid),
                    selected=rid in selected,
                    reported=r is not None and rid in r.reported,
                    updates_accepted=counts.get(rid, 0),
                    last_seen_s=now - s.last_seen[rid] if rid in s.last_seen else -1.0,
                )
                for rid, rec in sorted(s.robots.items())
            )
            history = tuple(
                RoundSummary(
                    round=h.round,
                    selected=len(h.selected),
                    accepted=len(h.reported),
                    duration_s=(h.closed_at or h.opened_at) - h.opened_at,
                    closed_by=h.closed_by,
                )
                for h in s.history
            )
            clusters, co_members = _composition(s)
            return FleetStatus(
                phase=s.phase,
                strategy=s.config.strategy.name,
                round=r.record.round if r else s.rounds_done,
                num_rounds=s.config.rounds.num_rounds,
                min_robots=s.config.rounds.min_robots,
                deadline_unix=r.record.deadline if r else 0.0,
                quorum=s.quorum(len(selected)) if r else 0,
                robots=robots,
                history=history,
                model_card=s.model_card,
                clusters=clusters,
                co_members=co_members,
            )

    def final_states(self) -> dict[str, State]:
        """Every member's current model (for tests and tools running in-process)."""
        s = self._state
        with s.cond:
            strategy = s.require_strategy()
            return {rid: dict(strategy.model_for(rid)) for rid in s.members}


def _composition(
    s: CoordinatorState,
) -> tuple[tuple[ClusterComposition, ...], CoMemberShares | None]:
    """Each cluster of a formed clustered fleet by the labels its members declared at Register
    (platform, environment), and the co-member shares (:mod:`fedepth.composition`); nothing
    before the fleet forms or for a strategy without clusters. Lock held."""
    strategy = s.strategy
    if not isinstance(strategy, ClusteredStrategy):
        return (), None
    ids = [c.cid for c in strategy.clients]
    labels = [
        dict(s.robots[c.cid].labels) if c.cid in s.robots else dict(c.labels)
        for c in strategy.clients
    ]
    M = np.asarray(strategy.M_star, dtype=bool)
    clusters = []
    for k, row in enumerate(M):
        members = np.flatnonzero(row)
        counts = composition.composition_counts(members, labels)
        clusters.append(
            ClusterComposition(
                k,
                tuple(ids[int(j)] for j in members),
                counts,
                composition.composition_label(counts),
            )
        )
    shares = composition.co_member_shares(M, labels)

    def known(key: str) -> float | None:
        return None if np.isnan(shares[key]) else shares[key]

    return tuple(clusters), CoMemberShares(
        known("platform"), known("environment"), known("both"), int(shares["alone"])
    )
