"""Client jobs and the executors that run a round's jobs, in this process or as Ray tasks.

:class:`SequentialExecutor` (default, in this process) and :class:`RayExecutor` (Ray tasks on
one or many machines) give the same result for the same seed. Ray pickles functions and
classes by module path: :class:`ClientJob`, :data:`JobResult` and the remote job function stay
at the top level of this module, which a fresh Ray worker imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fedepth.client import RoundResult, train_round
from fedepth.data.sequence import Sequence as RGBDSequence
from fedepth.models import DepthModel
from fedepth.models.state import State
from fedepth.sim.config import SimConfig
from fedepth.strategies import TrainTask


@dataclass
class ClientJob:
    """One client's local round: what an executor needs to run it anywhere.

    The task carries the recipe (steps, optimizer, input size, flips, base seed); the client
    trains with the seed derived from it, the round and its id (:func:`client_seed`).
    """

    cid: str
    sequences: list[RGBDSequence]
    task: TrainTask
    memory: dict[str, State]
    #: the round (keyword-only, so that a job built the old way, with a seed, fails loudly)
    rnd: int = field(kw_only=True)


#: What a client job returns (:class:`fedepth.client.RoundResult`).
JobResult = RoundResult


def run_job(config: SimConfig, job: ClientJob, model: DepthModel | None = None) -> JobResult:
    """Train one client for one round (the client side of a round, minus the network):
    :func:`fedepth.client.train_round` with the task's recipe (``config.recipe(rnd)`` for a
    task without one)."""
    return train_round(
        model or config.build_model(),
        job.task,
        job.sequences,
        cid=job.cid,
        rnd=job.rnd,
        memory=job.memory,
        fallback=config.recipe(job.rnd),
    )


class ModelCache:
    """One model, built for a configuration and kept while the configuration builds the same
    model (:meth:`SimConfig.model_key`): building newcrfs-lite costs about 90 ms, a tenth of a
    10-step job, and a job loads every weight and buffer before training, so a reused model
    gives the same result as a new one."""

    def __init__(self) -> None:
        self._entry: tuple[tuple[Any, ...], DepthModel] | None = None

    def get(self, config: SimConfig) -> DepthModel:
        key = config.model_key()
        if self._entry is None or self._entry[0] != key:
            self._entry = (key, config.build_model())
        return self._entry[1]


class Executor(Protocol):
    """Runs a round's client jobs; results in the order of the jobs."""

    def map(self, config: SimConfig, jobs: Sequence[ClientJob]) -> list[JobResult]: ...

    def close(self) -> None: ...


class SequentialExecutor:
    """Client jobs one after another in this process, reusing one model instance."""

    def __init__(self) -> None:
        self._model = ModelCache()

    def map(self, config: SimConfig, jobs: Sequence[ClientJob]) -> list[JobResult]:
        model = self._model.get(config)
        before = torch.get_num_threads()
        torch.set_num_threads(config.threads)
        try:
            return [run_job(config, job, model) for job in jobs]
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        self._model = ModelCache()


class RayExecutor:
    """Client jobs as Ray tasks, one CPU (or GPU) each, on a local or existing Ray cluster.

    ``address=None`` starts a local Ray runtime (``num_cpus`` of this machine); pass the address
    of a running cluster (``ray start --head`` ...) to spread clients over several machines.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        num_cpus: int | None = None,
        gpus_per_client: float = 0.0,
    ) -> None:
        import ray

        self._ray = ray
        if not ray.is_initialized():
            ray.init(
                address=address,
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        self._remote = ray.remote(num_cpus=1, num_gpus=gpus_per_client)(_ray_job)

    def map(self, config: SimConfig, jobs: Sequence[ClientJob]) -> list[JobResult]:
        refs = [self._remote.remote(config, job) for job in jobs]
        return list(self._ray.get(refs))

    def close(self) -> None:
        self._ray.shutdown()


#: A Ray worker's model, kept across the jobs it runs (as :class:`SequentialExecutor` keeps
#: its one).
_WORKER_MODEL = ModelCache()


def _ray_job(config: SimConfig, job: ClientJob) -> JobResult:
    torch.set_num_threads(config.threads)
    return run_job(config, job, _WORKER_MODEL.get(config))


def make_executor(name: str, **kwargs: Any) -> Executor:
    """``sequential`` (default) or ``ray``."""
    if name == "sequential":
        return SequentialExecutor()
    if name == "ray":
        return RayExecutor(**kwargs)
    raise ValueError(f"unknown executor {name!r}; choose sequential or ray")
