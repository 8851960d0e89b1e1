"""FedClust (Islam et al., ICPP 2024): one-shot clustering on partial weights of local models.

Round 0 is a warm-up: every client trains from the same initial model and the server keeps the
*partial weights* of each returned model. FedClust clusters on the final layer, whose weights
specialise most to a client's data; for a depth network that is the prediction layer. By
default those are the last ``layers`` floating-point parameters of the state in order (BatchNorm
statistics excluded), which for every registered model is the output layer's weight and bias;
``layer_prefix`` selects another layer by name. The proximity is the Euclidean distance between
the flattened partial weights (as in FedClust), clustered by average-linkage agglomeration into
``num_clusters`` clusters, or, when None, cut in the largest gap of the dendrogram. From then on
it is FedAvg inside each cluster. FedClust has no rule for unseen clients; here they go to the
cluster whose members' descriptors are nearest on average (the hard baselines' shared rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedepth import clustering
from fedepth.descriptor import Descriptor
from fedepth.strategies.base import (
    ClientInfo,
    ClientUpdate,
    ClusteredStrategy,
    RouteDecision,
    State,
)

_STAT_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


class FedClust(ClusteredStrategy):
    """FedAvg until every client has reported once, then FedAvg per weight-driven cluster."""

    name = "fedclust"

    def __init__(
        self, *, num_clusters: int | None = None, layers: int = 2, layer_prefix: str | None = None
    ) -> None:
        super().__init__()
        if num_clusters is not None and num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.num_clusters = num_clusters
        self.layers = layers
        self.layer_prefix = layer_prefix
        self.clustered = False
        self._partial: dict[int, np.ndarray] = {}

    def form_clusters(self) -> np.ndarray:
        return np.ones((1, len(self.clients)), dtype=bool)

    def partial_weights(self, state: Mapping[str, np.ndarray]) -> np.ndarray:
        """The flattened weights FedClust compares (see the module docstring)."""
        names = [
            n
            for n, t in state.items()
            if np.issubdtype(np.asarray(t).dtype, np.floating) and not n.endswith(_STAT_SUFFIXES)
        ]
        if self.layer_prefix is not None:
            names = [n for n in names if n.startswith(self.layer_prefix)]
            if not names:
                raise ValueError(f"fedclust: no tensor starts with {self.layer_prefix!r}")
        else:
            names = names[-self.layers :]
        return np.concatenate([np.asarray(state[n], dtype=np.float64).ravel() for n in names])

    def aggregate_train(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        if not self.clustered:
            for u in updates:
                self._partial.setdefault(self.index(u.cid), self.partial_weights(u.state))
            if len(self._partial) == len(self.clients):
                self._cluster()
        super().aggregate_train(rnd, updates)

    def _cluster(self) -> None:
        w = np.stack([self._partial[c] for c in range(len(self.clients))])
        sq = np.einsum("nd,nd->n", w, w)
        dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * w @ w.T, 0.0))
        if self.num_clusters is not None:
            self.M_star = clustering.hard_clusters_k(dist, self.num_clusters)
        else:
            self.M_star = clustering.hard_clusters(dist, clustering.largest_gap_threshold(dist))
        self.cluster_states = [dict(self.cluster_states[0]) for _ in range(self.M_star.shape[0])]
        self._client_cache.clear()
        self.clustered = True
        self._partial.clear()

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        ks = self.nearest_by_descriptor(descriptor) if self.clustered else [0]
        return RouteDecision(clusters=ks, weights=[1.0], state=self.average_of(ks))

    def add_client(self, info: ClientInfo) -> None:
        ks = self.nearest_by_descriptor(info.descriptor) if self.clustered else [0]
        self._append_client(info, memberships=ks)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, State]]:
        meta, states = super().state_dict()
        meta["clustered"] = self.clustered
        states.update({f"partial/{c}": {"w": w} for c, w in self._partial.items()})
        return meta, states

    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        super().load_state_dict(meta, states)
        self.clustered = bool(meta["clustered"])
        self._partial = {
            int(k.split("/", 1)[1]): np.asarray(v["w"])
            for k, v in states.items()
            if k.startswith("partial/")
        }
