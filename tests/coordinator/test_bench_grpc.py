"""`fedepth bench --transport grpc`: the benchmark through a real coordinator process and one
process per robot gives the in-process run's weights and numbers for the same seed.

The equality is exact (``np.array_equal``), not a tolerance: descriptors travel as float64 and
weights and hook state as raw float32 bytes; the coordinator initializes the strategy with the
robots sorted by id and aggregates updates sorted by id, and the robot ids are numbered in
scenario order, so every float sum runs in the in-process order; the robots train with
``fedepth.sim.run_job`` on one torch thread with the in-process seeds and keep their own hook
memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedepth.bench import BenchSpec, run_benchmark, sim_config
from fedepth.clustering import jeffreys_matrix
from fedepth.data.scenario import Scenario, load_scenario
from fedepth.descriptor import Descriptor, stack_descriptors
from fedepth.models import get_state, save_weights
from fedepth.sim import Fleet, MethodRun, SequentialExecutor, SimConfig, Simulation, initial_model
from fedepth.strategies import ClientInfo, ClusteredStrategy
from fedepth.strategies.pacfl import BASIS_KEY
from fedepth_cli.main import main
from fedepth_coordinator.benchrun import GrpcBench

BASE = sim_config(
    "hpe",
    "smoke",
    model="regression-lite",
    rounds=2,
    local_steps=1,
    last_rounds=2,  # both rounds evaluated: the robots wait for round 0's evaluation
    eval_frames=1,
)
#: fedavg: one global model; fedepth: soft clusters; scaffold: control variates go both ways
METHODS = ("fedavg", "fedepth", "scaffold")


@pytest.fixture(scope="module")
def scenario(smoke_hpe: Path) -> Iterator[Scenario]:
    sc = load_scenario(smoke_hpe)
    yield sc
    sc.close()


def _descriptor(position: float, dim: int = 8) -> Descriptor:
    return Descriptor(mean=np.full(dim, position), var=np.ones(dim), num_frames=4)


@pytest.fixture(scope="module")
def fleet(scenario: Scenario) -> Fleet:
    """The four smoke clients with descriptors on a line (0, 1, 2, 3): the untrained smoke
    encoder describes every client alike, which would leave FeDepth one cluster."""
    infos = [
        ClientInfo(
            c.name,
            c.num_samples,
            _descriptor(float(i)),
            labels={"platform": c.platform, "environment": c.environment},
            extra={BASIS_KEY: np.eye(8)[:, :2]},  # a summary travels with the descriptor
        )
        for i, c in enumerate(scenario.clients)
    ]
    queries = [
        (seq, _descriptor(0.2 + 2.6 * j), {BASIS_KEY: np.eye(8)[:, :2]})
        for j, seq in enumerate(scenario.test)
    ]
    return Fleet(scenario, infos, queries, descriptor_seconds=0.0)


@pytest.fixture(scope="module")
def config(fleet: Fleet) -> SimConfig:
    """tau between the divergence of neighbours and of clients two apart: clusters {0, 1, 2}
    and {1, 2, 3}, so clients 1 and 2 are in both."""
    A = jeffreys_matrix(*stack_descriptors([i.descriptor for i in fleet.infos]))
    tau = float((A[0, 1] + A[0, 2]) / 2)
    return replace(BASE, method_params={"fedepth": {"tau": tau}})


def _strip(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without what depends on the machine's speed or on the transport."""
    return {k: v for k, v in summary.items() if k not in ("timing", "transport", "grpc")}


def _assert_same_strategy(local: MethodRun, remote: MethodRun) -> None:
    a, b = local.strategy, remote.strategy
    assert isinstance(a, ClusteredStrategy) and isinstance(b, ClusteredStrategy)
    np.testing.assert_array_equal(a.M_star, b.M_star)
    _, states_a = a.state_dict()
    _, states_b = b.state_dict()
    assert states_a.keys() == states_b.keys()
    for group, state in states_a.items():  # every cluster model, and SCAFFOLD's control
        assert state.keys() == states_b[group].keys(), group
        for name, arr in state.items():
            assert np.array_equal(arr, states_b[group][name]), f"{group}/{name}"
            assert arr.dtype == states_b[group][name].dtype


@pytest.mark.slow
def test_grpc_transport_gives_the_in_process_weights_and_numbers(
    fleet: Fleet, config: SimConfig, tmp_path: Path
) -> None:
    initial = get_state(initial_model(config))
    with GrpcBench(fleet, initial, config, tmp_path / "grpc") as bench:
        bench.start((METHODS[0], None))  # robots and coordinator start while in-process runs
        sim = Simulation(fleet, initial, config, SequentialExecutor())
        local = {m: sim.run(m, progress=False) for m in METHODS}
        assert local["fedepth"].clusters == [[0, 1, 2], [1, 2, 3]]  # soft clusters
        remote = {
            m: bench.run(m, then=(METHODS[i + 1], None) if i + 1 < len(METHODS) else None)
            for i, m in enumerate(METHODS)
        }
    for m in METHODS:
        _assert_same_strategy(local[m], remote[m])
        a, b = local[m].summary(), remote[m].summary()
        assert _strip(a) == _strip(b), m  # metrics, curves, bytes, routes, clusters, tau
        assert b["transport"] == "grpc" and b["grpc"]["processes"] == len(fleet.infos)
        assert b["grpc"]["evaluated_rounds"] == [0, 1]
        assert b["grpc"]["closed_by"] == ["all reported"] * config.rounds
    # the robots' processes are gone, their logs stay; the tokens do not
    assert len(list((tmp_path / "grpc" / "robots").glob("*.log"))) == len(fleet.infos)
    assert not (tmp_path / "grpc" / "tokens.json").exists()


@pytest.mark.slow
def test_benchmark_over_grpc_writes_marked_results(smoke_hpe: Path, tmp_path: Path) -> None:
    weights = tmp_path / "w.safetensors"
    save_weights(initial_model(BASE), weights)  # skip pretraining
    out = tmp_path / "out"
    spec = BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("cl", "fedavg"),
        out=out,
        sim=replace(BASE, rounds=1, last_rounds=1, descriptor_frames=4),
        data_dir=smoke_hpe,
        cache_dir=tmp_path / "cache",
        weights=weights,
        progress=False,
        transport="grpc",
    )
    lines: list[str] = []
    run_benchmark(spec, echo=lines.append, transport=GrpcBench)
    results = json.loads((out / "results.json").read_text())
    assert results["transport"] == "grpc"
    assert results["methods"]["fedavg"]["transport"] == "grpc"
    assert results["methods"]["cl"]["transport"] == "inprocess"  # pooled: not a fleet
    assert any(line.startswith("cl: one pooled participant") for line in lines)
    assert 0 < results["methods"]["fedavg"]["abs_rel"] < 100
    assert "Transport: **gRPC**" in (out / "report.md").read_text()
    assert json.loads((out / "config.json").read_text())["transport"] == "grpc"
    assert (out / "grpc" / "000-fedavg" / "coordinator.log").stat().st_size > 0
    assert not (out / "grpc" / "000-fedavg" / "state").exists()  # the blobs are not kept

    # another seed on the same --out: finished pairs are skipped, the new ones run over gRPC
    lines.clear()
    more = run_benchmark(replace(spec, seeds=(0, 1)), echo=lines.append, transport=GrpcBench)
    assert "fedavg: seed 0 finished earlier" in " ".join(lines)
    fedavg = more["methods"]["fedavg"]
    assert fedavg["seeds"]["0"] == results["methods"]["fedavg"]["seeds"]["0"]
    assert fedavg["seeds"]["1"]["transport"] == "grpc" and fedavg["abs_rel_std"] > 0
    assert (out / "grpc" / "seed1" / "000-fedavg" / "coordinator.log").stat().st_size > 0


def test_bench_cli_takes_the_transport(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--scenario", "hpe", "--profile", "smoke", "--out", str(tmp_path)]
    code = main([*args, "--transport", "grpc", "--executor", "ray"])
    assert code == 2
    assert "--executor does not apply" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--transport", "carrier-pigeon"])


def test_fedepth_imports_no_grpc() -> None:
    """The gRPC transport is imported only when asked for."""
    code = (
        "import sys, fedepth.bench, fedepth_cli.main, fedepth.sim\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('grpc', 'grpc_health', 'fedepth_coordinator') or m.startswith('google.protobuf')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
