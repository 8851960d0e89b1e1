"""The Strategy contract: what every federated algorithm tells its clients and how it aggregates.

One round, whoever drives it (the in-process simulation or the gRPC coordinator):

1. ``initialize(clients, initial)`` once, when the fleet is known (clustering happens here);
2. ``configure_train(rnd, cids)`` -> one :class:`TrainTask` per selected client: the ONE model it
   downloads, plus the client hook (name, parameters, hook state such as SCAFFOLD's control
   variate); the driver adds the training recipe;
3. each client trains locally and returns a :class:`ClientUpdate`;
4. ``aggregate_train(rnd, updates)`` folds the updates that arrived (drop-outs allowed).

``route(descriptor)`` serves an unseen sequence; ``add_client`` places a robot that joins after
initialization. ``state_dict``/``load_state_dict`` make the server side restartable. The base
class owns the bookkeeping; :class:`ClusteredStrategy` implements the cluster-wise aggregation
that FedAvg (one cluster), FeDepth (soft clusters) and every clustered baseline share, so an
algorithm file only says how clusters are formed and what its clients run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedepth import clustering
from fedepth.descriptor import Descriptor
from fedepth.models.state import State
from fedepth.recipe import TrainRecipe
from fedepth.strategies.aggregate import (
    ClusterRule,
    client_models,
    cluster_models,
    server_step,
    weighted_mean,
)

#: A read-only view of a state. An update's tensors may live on disk (the coordinator spills
#: uploads to files and reads them back tensor by tensor while aggregating), so strategies read
#: updates through the Mapping protocol and never modify them in place.
StateView = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class ClientInfo:
    """What the server knows of a client: registration data and its descriptor, never data.

    ``extra`` holds algorithm-specific summaries a client chose to send (PACFL: the basis of
    its feature subspace, ``{"pacfl_basis": (D, p)}``). ``labels`` (platform, environment) are
    used only by the label-grouping baselines.
    """

    cid: str
    num_samples: int
    descriptor: Descriptor | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_samples <= 0:
            raise ValueError(f"client {self.cid!r}: num_samples must be > 0")


@dataclass
class TrainTask:
    """What a client receives for one round.

    ``recipe`` says how to train it (:func:`fedepth.client.train_round`); the round driver sets
    it (the strategy leaves it None): the simulation from its ``SimConfig``, the coordinator
    from its ``training`` section. None reaches a client only from a driver that sends none.
    """

    state: State
    hook: str | None = None
    hook_params: dict[str, float] = field(default_factory=dict)
    hook_state: dict[str, State] = field(default_factory=dict)
    recipe: TrainRecipe | None = None


@dataclass
class ClientUpdate:
    """What a client returns after local training (read-only views, see :data:`StateView`)."""

    cid: str
    state: StateView
    num_samples: int
    num_steps: int = 0
    extra: dict[str, StateView] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteDecision:
    """The clusters an unseen sequence is served by, their weights and the averaged model."""

    clusters: list[int]
    weights: list[float]
    state: State


class Strategy(ABC):
    """Base of every federated algorithm (server rule + the client hook it asks for)."""

    name: ClassVar[str]
    #: Client hook the trainer runs (None: plain local SGD/Adam steps).
    client_hook: ClassVar[str | None] = None
    #: Summaries of a client's data (``ClientInfo.extra`` keys) this strategy needs besides the
    #: descriptor; a robot sends these and no others (PACFL: its feature subspace basis). An
    #: instance may need more than its class (FeDepth whose tau reproduces PACFL's partition).
    client_summaries: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.clients: list[ClientInfo] = []
        self._index: dict[str, int] = {}

    # -- fleet -------------------------------------------------------------------------------
    def initialize(self, clients: Sequence[ClientInfo], initial: Mapping[str, np.ndarray]) -> None:
        """Register the fleet and the starting model; subclasses form clusters here."""
        if not clients:
            raise ValueError("a strategy needs at least one client")
        ids = [c.cid for c in clients]
        if len(set(ids)) != len(ids):
            raise ValueError("client ids must be unique")
        self.clients = list(clients)
        self._index = {cid: i for i, cid in enumerate(ids)}
        self.setup(dict(initial))

    @abstractmethod
    def setup(self, initial: State) -> None:
        """Algorithm-specific initialization once ``self.clients`` is set."""

    def index(self, cid: str) -> int:
        try:
            return self._index[cid]
        except KeyError:
            raise KeyError(f"unknown client {cid!r}") from None

    def add_client(self, info: ClientInfo) -> None:
        """A client that joins after initialization (default: it gets what routing gives)."""
        raise NotImplementedError(f"{self.name} does not accept clients after initialization")

    # -- rounds ------------------------------------------------------------------------------
    def hook_params(self) -> dict[str, float]:
        """Parameters of the client hook (FedProx mu, FedDyn alpha, ...)."""
        return {}

    def hook_state(self, cid: str) -> dict[str, State]:
        """Per-round server state the client hook needs (SCAFFOLD's c)."""
        return {}

    def configure_train(self, rnd: int, cids: Sequence[str]) -> dict[str, TrainTask]:
        return {
            cid: TrainTask(
                state=self.model_for(cid),
                hook=self.client_hook,
                hook_params=self.hook_params(),
                hook_state=self.hook_state(cid),
            )
            for cid in cids
        }

    @abstractmethod
    def aggregate_train(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        """Fold this round's updates (from any subset of clients) into the server models."""

    @abstractmethod
    def model_for(self, cid: str) -> State:
        """The one model client ``cid`` downloads (and is evaluated with)."""

    @abstractmethod
    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        """The model serving an unseen sequence with this descriptor.

        ``labels`` and ``extra`` carry what some baselines route by instead (the label groups:
        the sequence's platform/environment; PACFL: its feature subspace basis).
        """

    # -- persistence -------------------------------------------------------------------------
    @abstractmethod
    def state_dict(self) -> tuple[dict[str, Any], dict[str, State]]:
        """(JSON-able metadata, named states) that restore the server side exactly."""

    @abstractmethod
    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        """Restore what :meth:`state_dict` returned (after :meth:`initialize`)."""


class ClusteredStrategy(Strategy):
    """Cluster-wise aggregation over a K x N map (K = 1: FedAvg).

    Round rule (paper Sec. 3.3): cluster model k = data-size weighted mean of the updates of
    its members that reported this round (a cluster none of whose members reported keeps its
    model); client model c = plain mean of the models of the clusters c belongs to, computed on
    the server. Subclasses implement :meth:`form_clusters` and :meth:`route`.
    """

    #: How a cluster's model is made from its reporting members' updates: (states, sample
    #: counts) -> state. Default the data-size weighted mean; a robust rule (coordinate-wise
    #: trimmed mean or median, :func:`~fedepth.strategies.aggregate.robust_mean`) can be set
    #: on an instance. Strategies that override :meth:`aggregate_train` ignore it.
    cluster_rule: ClusterRule | None = None
    #: The server optimizer of every cluster model (:func:`~fedepth.strategies.aggregate.
    #: server_step`, FedAvgM): the round moves cluster k by ``server_lr`` times its momentum
    #: buffer of pseudo-gradients. 1.0 / 0.0 (the defaults): the model is the aggregate, as in
    #: the paper. Set with the strategy parameters ``server_lr`` / ``server_momentum``.
    server_lr: float = 1.0
    server_momentum: float = 0.0

    def setup(self, initial: State) -> None:
        self.M_star = np.asarray(self.form_clusters(), dtype=bool)
        if self.M_star.ndim != 2 or self.M_star.shape[1] != len(self.clients):
            raise ValueError(
                f"{self.name}: cluster map {self.M_star.shape} does not cover "
                f"{len(self.clients)} clients"
            )
        if not self.M_star.any(axis=0).all():
            raise ValueError(f"{self.name}: some client belongs to no cluster")
        self.cluster_states: list[State] = [dict(initial) for _ in range(self.M_star.shape[0])]
        self._client_cache: dict[int, State] = {}
        #: cluster -> momentum buffer of the server optimizer (kept only when it is on)
        self.velocity: dict[int, State] = {}

    @property
    def server_optimizer(self) -> bool:
        """Whether a round moves a cluster model elsewhere than to the aggregate."""
        return self.server_lr != 1.0 or self.server_momentum != 0.0

    @abstractmethod
    def form_clusters(self) -> np.ndarray:
        """The K x N boolean cluster map of ``self.clients``."""

    def aggregate_train(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        if not updates:
            return
        by_index = {self.index(u.cid): u for u in updates}
        reported = sorted(by_index)  # client order, as the map's columns
        previous = self.cluster_states
        self.cluster_states = cluster_models(
            [by_index[c].state for c in reported],
            [by_index[c].num_samples for c in reported],
            self.M_star[:, reported],
            rule=self.cluster_rule,
            previous=previous,
        )
        if self.server_optimizer:
            for k in np.flatnonzero(self.M_star[:, reported].any(axis=1)):
                self.cluster_states[k], self.velocity[int(k)] = server_step(
                    previous[k],
                    self.cluster_states[k],
                    self.velocity.get(int(k)),
                    lr=self.server_lr,
                    momentum=self.server_momentum,
                )
        self._client_cache.clear()

    def model_for(self, cid: str) -> State:
        c = self.index(cid)
        if c not in self._client_cache:
            ks = np.flatnonzero(self.M_star[:, c])
            self._client_cache[c] = client_models(
                [self.cluster_states[int(k)] for k in ks], np.ones((ks.size, 1), dtype=bool)
            )[0]
        return self._client_cache[c]

    def _append_client(self, info: ClientInfo, memberships: Sequence[int]) -> None:
        """Add a late client as a new column of the map, member of the given clusters."""
        if info.cid in self._index:
            raise ValueError(f"client {info.cid!r} is already registered")
        column = np.zeros((self.M_star.shape[0], 1), dtype=bool)
        column[list(memberships), 0] = True
        self.M_star = np.concatenate([self.M_star, column], axis=1)
        self._index[info.cid] = len(self.clients)
        self.clients.append(info)

    def nearest_by_descriptor(self, descriptor: Descriptor | None) -> list[int]:
        """The single cluster whose members' descriptors are nearest on average (Jeffreys).

        The routing rule of the hard-clustering baselines that have no routing of their own.
        """
        if descriptor is None:
            raise ValueError(f"{self.name} routes unseen sequences by descriptor; none given")
        known = [c.descriptor for c in self.clients]
        if any(d is None for d in known):
            raise ValueError(f"{self.name}: routing by descriptor needs every client's descriptor")
        means = np.stack([d.mean for d in known if d is not None])
        variances = np.stack([d.var for d in known if d is not None])
        div = clustering.jeffreys_cross(
            descriptor.mean[None], descriptor.var[None], means, variances
        )[0]
        return [int(np.argmin(clustering.cluster_scores(div, self.M_star)))]

    def average_of(self, clusters: Sequence[int]) -> State:
        """Plain mean of the given clusters' models (the routed model)."""
        if len(clusters) == 1:
            return self.cluster_states[clusters[0]]
        return weighted_mean([self.cluster_states[k] for k in clusters], np.ones(len(clusters)))

    def state_dict(self) -> tuple[dict[str, Any], dict[str, State]]:
        meta = {
            "name": self.name,
            "M_star": self.M_star.astype(int).tolist(),
            "clients": [c.cid for c in self.clients],
        }
        states = {f"cluster/{k}": s for k, s in enumerate(self.cluster_states)}
        states.update({f"velocity/{k}": v for k, v in self.velocity.items()})
        return meta, states

    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        if meta.get("clients") != [c.cid for c in self.clients]:
            raise ValueError("saved strategy state belongs to a different fleet")
        self.M_star = np.asarray(meta["M_star"], dtype=bool)
        self.cluster_states = [dict(states[f"cluster/{k}"]) for k in range(self.M_star.shape[0])]
        self.velocity = {
            k: dict(states[f"velocity/{k}"])
            for k in range(self.M_star.shape[0])
            if f"velocity/{k}" in states
        }
        self._client_cache = {}
