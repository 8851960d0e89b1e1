"""Federated learning strategies: one file per algorithm; shared arithmetic in ``aggregate``.

``create_strategy(name, **cfg)`` builds one by its method name (see ``list_strategies()``);
``make_client_hook(task, memory)`` builds the client half a task asks for (FedProx, SCAFFOLD,
FedDyn), with ``memory`` the client's own persistent store (control variates, gradient state).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from fedepth.strategies.aggregate import check_server_optimizer
from fedepth.strategies.base import (
    ClientInfo,
    ClientUpdate,
    ClusteredStrategy,
    RouteDecision,
    State,
    StateView,
    Strategy,
    TrainTask,
)
from fedepth.strategies.cl import Centralized
from fedepth.strategies.fedavg import FedAvg
from fedepth.strategies.fedclust import FedClust
from fedepth.strategies.feddyn import FedDyn, FedDynHook
from fedepth.strategies.fedepth import FeDepth
from fedepth.strategies.fedprox import FedProx, FedProxHook
from fedepth.strategies.group import GroupByEnvironment, GroupByPlatform
from fedepth.strategies.hard import HardClustering
from fedepth.strategies.pacfl import PACFL
from fedepth.strategies.scaffold import Scaffold, ScaffoldHook

_REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        FedAvg,
        FedProx,
        FedDyn,
        Scaffold,
        FeDepth,
        HardClustering,
        PACFL,
        FedClust,
        GroupByPlatform,
        GroupByEnvironment,
        Centralized,
    )
}


ClientHook = FedProxHook | ScaffoldHook | FedDynHook
_CLIENT_HOOKS: dict[str, type[ClientHook]] = {
    "fedprox": FedProxHook,
    "scaffold": ScaffoldHook,
    "feddyn": FedDynHook,
}


def make_client_hook(task: TrainTask, memory: Mapping[str, State]) -> ClientHook | None:
    """The client hook for a round's task (None when the algorithm needs none).

    After training, call ``hook.remember(memory)`` so the client keeps its own state.
    """
    if task.hook is None:
        return None
    try:
        cls = _CLIENT_HOOKS[task.hook]
    except KeyError:
        raise ValueError(
            f"unknown client hook {task.hook!r}; known: {', '.join(sorted(_CLIENT_HOOKS))}"
        ) from None
    return cls.from_task(task, memory)


def list_strategies() -> list[str]:
    """Names of the registered strategies."""
    return sorted(_REGISTRY)


def create_strategy(name: str, **cfg: Any) -> Strategy:
    """A new strategy by method name, configured by keyword arguments.

    ``server_lr`` and ``server_momentum`` configure the server optimizer of a strategy that
    aggregates cluster-wise (:class:`ClusteredStrategy`); the other keywords are the
    strategy's own."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; known: {', '.join(list_strategies())}"
        ) from None
    server = {k: cfg.pop(k) for k in SERVER_OPTIMIZER if k in cfg}
    strategy = cls(**cfg)
    if server:
        if not aggregates_clusterwise(strategy):
            raise ValueError(
                f"{name} aggregates by its own rule; it takes no {', '.join(sorted(server))}"
            )
        lr = float(server.get("server_lr", 1.0))
        momentum = float(server.get("server_momentum", 0.0))
        check_server_optimizer(lr, momentum)
        strategy.server_lr, strategy.server_momentum = lr, momentum
    return strategy


def forms_clusters(name: str) -> bool:
    """Whether the method ``name`` forms clusters of clients (FeDepth, hard clustering, PACFL,
    FedClust, the label groups), not one global model (FedAvg and the methods built on it, CL)."""
    cls = _REGISTRY.get(name)
    return cls is not None and issubclass(cls, ClusteredStrategy) and not issubclass(cls, FedAvg)


def aggregates_clusterwise(strategy: Strategy) -> TypeGuard[ClusteredStrategy]:
    """Whether ``strategy`` forms its models with the shared cluster-wise rule of
    :class:`ClusteredStrategy` (and so takes a server optimizer and a robust rule), not with a
    server rule of its own (SCAFFOLD, FedDyn)."""
    own = type(strategy).aggregate_train is not ClusteredStrategy.aggregate_train
    return isinstance(strategy, ClusteredStrategy) and not own


#: The strategy parameters of the server optimizer (any :class:`ClusteredStrategy`).
SERVER_OPTIMIZER = ("server_lr", "server_momentum")


__all__ = [
    "ClientInfo",
    "ClientUpdate",
    "ClusteredStrategy",
    "FeDepth",
    "FedAvg",
    "RouteDecision",
    "State",
    "StateView",
    "Strategy",
    "TrainTask",
    "aggregates_clusterwise",
    "create_strategy",
    "forms_clusters",
    "list_strategies",
    "make_client_hook",
]
