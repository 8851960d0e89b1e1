"""In-process federation: Strategy + LocalTrainer driven round by round over a scenario's clients.

The simulation uses the same objects the coordinator and the robots use (a
:class:`~fedepth.strategies.Strategy` on the server side; :func:`fedepth.client.train_round`,
the one client-round function, and the descriptor extractor on the client side), so its
numbers are those of a deployed fleet minus the network. Every task carries the round's
:class:`~fedepth.recipe.TrainRecipe` (:meth:`SimConfig.recipe`), as the coordinator's do.
Client training runs through an executor: :class:`SequentialExecutor` (default, in this
process) or :class:`RayExecutor` (Ray tasks on the CPUs/GPUs of one or many machines); both
give the same result for the same seed.

Per round it records the test metrics of every unseen sequence (routed by the strategy, no
test-time training), the bytes each client downloads and uploads, and the time spent in local
training versus federation overhead (descriptors, clustering, aggregation, serialization).
Final numbers are the mean over the last ``last_rounds`` rounds, as in the paper.

The package's modules, one job each (everything public is importable from ``fedepth.sim``):
:mod:`~fedepth.sim.config` (:class:`SimConfig`), :mod:`~fedepth.sim.executors` (client jobs,
the sequential and Ray executors), :mod:`~fedepth.sim.wire` (the wire format's cost),
:mod:`~fedepth.sim.fleet` (descriptors of the clients and test sequences),
:mod:`~fedepth.sim.evaluation` (scoring routed models), :mod:`~fedepth.sim.records` (round
records, a method's run, final numbers), :mod:`~fedepth.sim.simulation` (the in-process
transport of :class:`fedepth.rounds.RoundDriver`, the round loop the coordinator runs too, and
the run's resumable state), :mod:`~fedepth.sim.pretraining` (the initial checkpoint).
"""

from fedepth.recipe import client_seed
from fedepth.sim.config import PRETRAIN_REGIME, PRETRAIN_THREADS, SimConfig, config_dict
from fedepth.sim.evaluation import Router, Sample, eval_indices, evaluate_sequence
from fedepth.sim.executors import (
    ClientJob,
    Executor,
    JobResult,
    RayExecutor,
    SequentialExecutor,
    make_executor,
    run_job,
)
from fedepth.sim.fleet import Fleet, describe_client, fleet_extractor, prepare_fleet
from fedepth.sim.pretraining import initial_model, pretrain
from fedepth.sim.records import (
    TABLE_METRICS,
    MethodRun,
    RoundRecord,
    final_metrics,
    final_validation,
    strategy_outputs,
)
from fedepth.sim.simulation import Checkpointer, RunState, Simulation
from fedepth.sim.wire import distinct_payloads, state_nbytes, wire_seconds

__all__ = [
    "PRETRAIN_REGIME",
    "PRETRAIN_THREADS",
    "TABLE_METRICS",
    "Checkpointer",
    "ClientJob",
    "Executor",
    "Fleet",
    "JobResult",
    "MethodRun",
    "RayExecutor",
    "RoundRecord",
    "Router",
    "RunState",
    "Sample",
    "SequentialExecutor",
    "SimConfig",
    "Simulation",
    "client_seed",
    "config_dict",
    "describe_client",
    "distinct_payloads",
    "eval_indices",
    "evaluate_sequence",
    "final_metrics",
    "final_validation",
    "fleet_extractor",
    "initial_model",
    "make_executor",
    "prepare_fleet",
    "pretrain",
    "run_job",
    "state_nbytes",
    "strategy_outputs",
    "wire_seconds",
]
