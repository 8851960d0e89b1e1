"""FeDepth (ECCV 2026): soft clusters from Jeffreys divergences of client descriptors.

Clients are clustered once, before training: ``A`` = Jeffreys matrix of the descriptors,
``M = A <= tau``, redundant rows merged into ``M*``. Tau is calibrated for a target overlap
ratio (paper, HPE: 20 %) or, with ``match="pacfl"``, chosen so that the clusters best reproduce
PACFL's hard partition (paper, BMR: "we set tau such that the resulting cluster assignments
closely approximate those of the hard clustering method"). Each round, cluster models are
data-size weighted means of their members' updates, and each client downloads the mean of its
clusters' models (computed here, so one download per client). An unseen sequence is routed to
every cluster whose mean divergence to the sequence is <= tau, else to the nearest one, and
served the mean of those models.

The merge and the routing rule are parameters (:mod:`fedepth.cluster_rules`): ``rules`` names a
preset (``paper``, the default: ``subsets`` merging, ``within-tau`` routing, as above);
``merge`` / ``routing`` replace its halves. Tau is calibrated (or matched) on the map the
strategy's own merge rule merges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedepth import cluster_rules, clustering
from fedepth.descriptor import Descriptor, stack_descriptors
from fedepth.strategies.base import ClientInfo, ClusteredStrategy, RouteDecision, State
from fedepth.strategies.pacfl import BASIS_KEY, client_bases, pacfl_partition

#: Hard partitions FeDepth's tau can be chosen to reproduce (``match``): PACFL's.
MATCH_RULES = ("pacfl",)


class TauRule:
    """How FeDepth, and hard clustering at FeDepth's threshold, set tau (a mixin).

    ``tau`` given: used as is. Else ``match="pacfl"``: the tau whose soft clusters best
    reproduce PACFL's partition (every client then also sends its PACFL basis). Else: the tau
    calibrated for the ``overlap`` ratio. :attr:`threshold_rule` says which, for the report.
    The soft clusters are merged by :attr:`merge_rule`, so the overlap (or the match) is that of
    the map the strategy's rule gives; :attr:`routing_rule` routes unseen sequences. Both are
    in :meth:`rules_meta`, which the strategies' state carries.
    """

    client_summaries: tuple[str, ...]
    tau: float | None
    merge_rule: str = "subsets"
    routing_rule: str = "within-tau"

    def _init_tau_rule(
        self, overlap: float, tau: float | None, match: str | None, merge: str = "subsets"
    ) -> None:
        """Check and keep the rule; refuses a tau < 0, an overlap outside [0, 1) (1 is not the
        paper's "100 %", one cluster of everyone: that is ``tau=inf``), an unknown ``match``
        or merge rule, or ``match`` with a fixed tau (two rules for one threshold)."""
        if match is not None and match not in MATCH_RULES:
            raise ValueError(f"unknown match {match!r}; known: {', '.join(MATCH_RULES)}")
        if match is not None and tau is not None:
            raise ValueError("give tau or match, not both: each sets the threshold")
        if tau is None and not 0.0 <= overlap < 1.0:
            raise ValueError(
                f"overlap must lie in [0, 1), got {overlap} (one cluster of everyone, the "
                "paper's 100 %, is tau=inf)"
            )
        if tau is not None and tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        self.merge_rule = cluster_rules.check_merge(merge)
        self.target_overlap = overlap
        self.tau = tau
        self.match = match
        self._tau_given = tau is not None
        if match is not None:
            self.client_summaries = (BASIS_KEY,)

    @property
    def threshold_rule(self) -> str:
        """How tau was (or will be) set, in words."""
        if self._tau_given:
            return "given"
        if self.match == "pacfl":
            return "chosen so the clusters best reproduce PACFL's partition"
        return f"calibrated for {self.target_overlap:.0%} overlap"

    def rules_meta(self) -> dict[str, str]:
        """The merge and routing rule by name (the state and the report record them)."""
        return {"merge": self.merge_rule, "routing": self.routing_rule}

    def _load_rules(self, meta: Mapping[str, Any]) -> None:
        """Take the rules a saved state names (states saved before the rules existed name
        none: the paper's were the only ones then)."""
        self.merge_rule = cluster_rules.check_merge(str(meta.get("merge", "subsets")))
        default = type(self).routing_rule
        self.routing_rule = cluster_rules.check_routing(str(meta.get("routing", default)))

    def _settle_tau(self, A: np.ndarray, clients: list[ClientInfo]) -> clustering.Clustering:
        """FeDepth's clustering of the Jeffreys matrix ``A`` by the rule; sets ``tau``."""
        merge = self.merge_rule
        if self.tau is not None:
            return clustering.soft_clustering(A, self.tau, merge=merge)
        if self.match == "pacfl":
            reference, _ = pacfl_partition(client_bases(clients))
            result = clustering.match_partition(A, reference, merge=merge)
        else:
            result = clustering.calibrate(A, self.target_overlap, merge=merge)
        self.tau = result.tau
        return result


class FeDepth(TauRule, ClusteredStrategy):
    """Soft clustered FL; ``tau`` fixed, or (tau None) calibrated for ``overlap``, or chosen
    to reproduce a hard partition (``match="pacfl"``: then ``overlap`` is not used, and every
    client also sends its PACFL subspace basis). ``rules`` (a preset of
    :data:`~fedepth.cluster_rules.RULES`, default ``paper``) names the merge and the routing
    rule; ``merge`` and ``routing`` (names of :mod:`fedepth.cluster_rules`) replace either."""

    name = "fedepth"

    def __init__(
        self,
        *,
        overlap: float = 0.2,
        tau: float | None = None,
        match: str | None = None,
        rules: str = "paper",
        merge: str | None = None,
        routing: str | None = None,
    ) -> None:
        super().__init__()
        merge_rule, self.routing_rule = cluster_rules.resolve_rules(rules, merge, routing)
        self._init_tau_rule(overlap, tau, match, merge_rule)

    def _descriptors(self, clients: list[ClientInfo]) -> list[Descriptor]:
        missing = [c.cid for c in clients if c.descriptor is None]
        if missing:
            raise ValueError(f"fedepth needs a descriptor from every client; missing: {missing}")
        return [c.descriptor for c in clients if c.descriptor is not None]

    def form_clusters(self) -> np.ndarray:
        means, variances = stack_descriptors(self._descriptors(self.clients))
        self.A = clustering.jeffreys_matrix(means, variances)
        return self._settle_tau(self.A, self.clients).M_star

    def divergences(self, descriptor: Descriptor) -> np.ndarray:
        """Jeffreys divergence from a descriptor to every registered client (N,)."""
        means, variances = stack_descriptors(self._descriptors(self.clients))
        return clustering.jeffreys_cross(
            descriptor.mean[None], descriptor.var[None], means, variances
        )[0]

    def cluster_scores(self, descriptor: Descriptor) -> np.ndarray:
        """``S_k`` of a descriptor: its mean Jeffreys divergence to each cluster's members (K,),
        what :meth:`route`'s rule chooses by."""
        return clustering.cluster_scores(self.divergences(descriptor), self.M_star)

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
        ks = cluster_rules.route(
            self.divergences(descriptor), self.M_star, self.tau, self.routing_rule
        )
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
        meta.update(self.rules_meta())
        return meta, states

    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        super().load_state_dict(meta, states)
        self.tau = float(meta["tau"])
        self._load_rules(meta)
