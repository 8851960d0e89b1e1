"""Hard clustering (paper Table 3a): average-linkage clusters of the Jeffreys matrix cut at tau.

The same descriptors and the same tau as FeDepth (calibrated for the same target overlap ratio,
matched to the same partition, or given), but every client in exactly one cluster, as in the
agglomerative clustering PACFL uses. Unseen sequences go to the single cluster with the smallest
mean divergence (``routing="nearest"``, the default; another rule of
:mod:`fedepth.cluster_rules` can serve the mean of several). ``merge`` is the merge rule of the
soft map tau is calibrated (or matched) on: FeDepth's (``subsets``, the paper's, by default), so
that this is hard clustering at the tau of a FeDepth run with the same ``merge``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedepth import cluster_rules, clustering
from fedepth.descriptor import Descriptor, stack_descriptors
from fedepth.strategies.base import ClientInfo, ClusteredStrategy, RouteDecision, State
from fedepth.strategies.fedepth import TauRule


class HardClustering(TauRule, ClusteredStrategy):
    """Agglomerative (average linkage) clusters on the Jeffreys matrix at FeDepth's tau."""

    name = "hard"
    routing_rule = "nearest"

    def __init__(
        self,
        *,
        overlap: float = 0.2,
        tau: float | None = None,
        match: str | None = None,
        merge: str = "subsets",
        routing: str = "nearest",
    ) -> None:
        super().__init__()
        self._init_tau_rule(overlap, tau, match, merge)
        self.routing_rule = cluster_rules.check_routing(routing)

    def form_clusters(self) -> np.ndarray:
        if any(c.descriptor is None for c in self.clients):
            raise ValueError("hard clustering needs a descriptor from every client")
        means, variances = stack_descriptors([c.descriptor for c in self.clients if c.descriptor])
        A = clustering.jeffreys_matrix(means, variances)
        return clustering.hard_clusters(A, self._settle_tau(A, self.clients).tau)

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        if self.routing_rule == "nearest":
            ks = self.nearest_by_descriptor(descriptor)
        else:
            if descriptor is None:
                raise ValueError("hard clustering routes by descriptor; none given")
            means, variances = stack_descriptors(
                [c.descriptor for c in self.clients if c.descriptor]
            )
            div = clustering.jeffreys_cross(
                descriptor.mean[None], descriptor.var[None], means, variances
            )[0]
            assert self.tau is not None
            ks = cluster_rules.route(div, self.M_star, self.tau, self.routing_rule)
        return RouteDecision(
            clusters=ks, weights=[1.0 / len(ks)] * len(ks), state=self.average_of(ks)
        )

    def add_client(self, info: ClientInfo) -> None:
        """A late robot joins its nearest cluster, whatever the routing: one cluster each."""
        self._append_client(info, memberships=self.nearest_by_descriptor(info.descriptor))

    def state_dict(self) -> tuple[dict[str, Any], dict[str, State]]:
        meta, states = super().state_dict()
        meta["tau"] = self.tau
        meta.update(self.rules_meta())
        return meta, states

    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        super().load_state_dict(meta, states)
        if meta.get("tau") is not None:
            self.tau = float(meta["tau"])
        self._load_rules(meta)
