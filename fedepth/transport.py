"""The seam between the benchmark and a transport that runs methods outside this process.

:func:`fedepth.bench.run_benchmark` runs every method in-process (:class:`fedepth.sim.Simulation`)
unless it is handed a :class:`Transport`: a factory that, for one seed's prepared fleet, opens a
:class:`FleetRunner` which runs methods elsewhere (a real coordinator and one process per robot)
and returns the same :class:`~fedepth.sim.MethodRun` the simulation returns. ``fedepth`` holds
no such transport: the one over gRPC is ``fedepth_coordinator.benchrun.GrpcBench`` (the class
itself is the factory), which the ``fedepth`` command passes for ``--transport grpc``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from fedepth.sim import Fleet, MethodRun, SimConfig
from fedepth.strategies import State

#: ``BenchSpec.transport`` of the runs that need no :class:`Transport`.
INPROCESS = "inprocess"

#: A run to start: a method name and its strategy parameters (None: the config's).
PlannedRun = tuple[str, Mapping[str, Any] | None]


class FleetRunner(Protocol):
    """Runs methods of one prepared fleet outside this process; holds resources until closed."""

    def start(self, first: PlannedRun | None = None) -> None:
        """Start in the background (say, while in-process methods run), with ``first`` next."""

    def run(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        then: PlannedRun | None = None,
    ) -> MethodRun:
        """Run ``method`` from round 0 (``then``: the run after it, to prepare meanwhile)."""

    def close(self) -> None:
        """Release what :meth:`start` and :meth:`run` started."""


class Transport(Protocol):
    """Opens the :class:`FleetRunner` of one seed's fleet, initial weights and config, logging
    into ``workdir``."""

    def __call__(
        self,
        fleet: Fleet,
        initial: State,
        config: SimConfig,
        workdir: Path,
        *,
        progress: bool = False,
    ) -> FleetRunner: ...


class TransportError(ValueError):
    """A benchmark asks for a transport it was not handed (or is handed one it did not ask for)."""


def check_transport(name: str, transport: Transport | None) -> None:
    """Refuse a ``BenchSpec.transport`` other than in-process without a :class:`Transport`."""
    if name == INPROCESS:
        if transport is not None:
            raise TransportError(
                f"a transport was passed for BenchSpec.transport={INPROCESS!r}; name the "
                "transport it is in the spec (e.g. 'grpc'), or pass none"
            )
        return
    if transport is None:
        raise TransportError(
            f"BenchSpec.transport={name!r} needs a transport: fedepth runs methods only "
            f"in-process; call run_benchmark(spec, transport=...) with one (for 'grpc': "
            "fedepth_coordinator.benchrun.GrpcBench, which `fedepth bench --transport grpc` "
            "passes)"
        )
