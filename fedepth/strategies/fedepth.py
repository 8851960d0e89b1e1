"""FeDepth (ECCV 2026): soft clusters from Jeffreys divergences of client descriptors.

Clients are clustered once, before training: ``A`` = Jeffreys matrix of the descriptors,
``M = A <= tau`` with tau calibrated for a target overlap ratio (paper: 20 %), redundant rows
merged into ``M*``. Each round, cluster models are data-size weighted means of their members'
updates, and each client downloads the mean of its clusters' models (computed here, so one
download per client). An unseen sequence is routed to every cluster whose mean divergence to
the sequence is <= tau, else to the nearest one, and served the mean of those models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedepth import clustering
from fedepth.descriptor import Descriptor, stack_descriptors
from fedepth.strategies.base import ClientInfo, ClusteredStrategy, RouteDecision, State


class FeDepth(ClusteredStrategy):
    """Soft clustered FL; ``tau`` fixed, or calibrated for ``overlap`` when tau is None."""

    name = "fedepth"

    def __init__(self, *, overlap: float = 0.2, tau: float | None = None) -> None:
        super().__init__()
        if tau is None and not 0.0 <= overlap <= 1.0:
            raise ValueError(f"overlap must lie in [0, 1], got {overlap}")
        if tau is not None and tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        self.target_overlap = overlap
        self.tau = tau

    def _descriptors(self, clients: list[ClientInfo]) -> list[Descriptor]:
        missing = [c.cid for c in clients if c.descriptor is None]
        if missing:
            raise ValueError(f"fedepth needs a descriptor from every client; missing: {missing}")
        return [c.descriptor for c in clients if c.descriptor is not None]

    def form_clusters(self) -> np.ndarray:
        means, variances = stack_descriptors(self._descriptors(self.clients))
        self.A = clustering.jeffreys_matrix(means, variances)
        if self.tau is None:
            result = clustering.calibrate(self.A, self.target_overlap)
            self.tau = result.tau
            return result.M_star
        return clustering.soft_clustering(self.A, self.tau).M_star

    def divergences(self, descriptor: Descriptor) -> np.ndarray:
        """Jeffreys divergence from a descriptor to every registered client (N,)."""
        means, variances = stack_descriptors(self._descriptors(self.clients))
        return clustering.jeffreys_cross(
            descriptor.mean[None], descriptor.var[None], means, variances
        )[0]

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        if descriptor is None:
            raise ValueError("fedepth routes by descriptor; none given")
        assert self.tau is not None
        ks = clustering.route(self.divergences(descriptor), self.M_star, self.tau)
        return RouteDecision(
            clusters=ks, weights=[1.0 / len(ks)] * len(ks), state=self.average_of(ks)
        )

    def add_client(self, info: ClientInfo) -> None:
        """A robot registering after clustering joins the clusters its descriptor routes to."""
        if info.descriptor is None:
            raise ValueError(f"client {info.cid!r} needs a descriptor to join")
        self._append_client(info, memberships=self.route(info.descriptor).clusters)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, State]]:
        meta, states = super().state_dict()
        meta["tau"] = self.tau
        return meta, states

    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        super().load_state_dict(meta, states)
        self.tau = float(meta["tau"])
