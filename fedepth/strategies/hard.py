"""Hard clustering (paper Table 3a): average-linkage clusters of the Jeffreys matrix cut at tau.

The same descriptors and the same tau as FeDepth (calibrated for the same target overlap ratio,
matched to the same partition, or given), but every client in exactly one cluster, as in the
agglomerative clustering PACFL uses. Unseen sequences go to the single cluster with the smallest
mean divergence.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedepth import clustering
from fedepth.descriptor import Descriptor, stack_descriptors
from fedepth.strategies.base import ClientInfo, ClusteredStrategy, RouteDecision
from fedepth.strategies.fedepth import TauRule


class HardClustering(TauRule, ClusteredStrategy):
    """Agglomerative (average linkage) clusters on the Jeffreys matrix at FeDepth's tau."""

    name = "hard"

    def __init__(
        self, *, overlap: float = 0.2, tau: float | None = None, match: str | None = None
    ) -> None:
        super().__init__()
        self._init_tau_rule(overlap, tau, match)

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
        ks = self.nearest_by_descriptor(descriptor)
        return RouteDecision(clusters=ks, weights=[1.0], state=self.average_of(ks))

    def add_client(self, info: ClientInfo) -> None:
        self._append_client(info, memberships=self.nearest_by_descriptor(info.descriptor))
