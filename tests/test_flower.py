"""fedepth on Flower (fedepth_flower, examples/flower), with the real flwr 1.42.

- the records: states, tasks (recipe included) and updates come back bit for bit;
- bad input: an unknown strategy in the run config stops the App with one error naming it; in
  the descriptor round a node whose partition is empty (the real ClientApp's reply) and a node
  whose descriptor has another dimension are left out, each with one error line naming the
  node, and the federation goes on with the others; an update the bounds reject is left out
  of its round;
- ``flwr run`` under Flower's simulation runtime (a SuperLink started here, a node per client
  and one node more, whose partition is empty) gives, for FedAvg and FeDepth on HPE smoke
  seed 0, the in-process benchmark's cluster maps and final weights bit for bit (every float
  sum runs in the same order: the nodes describe and train with the benchmark's functions on
  one torch thread, the bridge initializes and aggregates in the scenario's order, arrays
  travel as numpy bytes), and its numbers in the benchmark's results.json;
- the same App on Flower's deployment runtime: a SuperLink and two SuperNodes on loopback
  (insecure), each SuperNode with its own partition in its node config.

Skipped without flwr (``make install-flower``; ``make test`` installs it).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

flwr = pytest.importorskip(
    "flwr", reason="flwr is not installed: `make install-flower` (make test installs it)"
)

from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    RecordDict,
)

from fedepth.bench import sim_config  # noqa: E402
from fedepth.data.scenario import load_scenario  # noqa: E402
from fedepth.descriptor import Descriptor  # noqa: E402
from fedepth.models import get_state, save_weights  # noqa: E402
from fedepth.recipe import TrainRecipe  # noqa: E402
from fedepth.sim import SequentialExecutor, Simulation, initial_model, prepare_fleet  # noqa: E402
from fedepth.strategies import (  # noqa: E402
    ClientInfo,
    ClientUpdate,
    ClusteredStrategy,
    TrainTask,
    create_strategy,
)
from fedepth_flower import client_app  # noqa: E402
from fedepth_flower.records import (  # noqa: E402
    CONFIG,
    content_to_task,
    content_to_update,
    info_to_content,
    recipe_from_config,
    state_to_record,
    task_to_content,
    update_to_content,
)
from fedepth_flower.settings import RunConfigError, settings_from_run_config  # noqa: E402
from fedepth_flower.strategy import FedepthStrategy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "flower"
BIN = Path(sys.executable).parent
CFG = sim_config("hpe", "smoke", seed=0)
#: the methods of the equivalence: one global model, and soft clusters
METHODS = ("fedavg", "fedepth")
#: configure_train does not use its Grid (the nodes are the descriptor round's)
NO_GRID: Any = None


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


# -- records ---------------------------------------------------------------------------------
def test_tasks_and_updates_come_back_bit_for_bit_recipe_included() -> None:
    rng = np.random.default_rng(0)
    state = {
        "conv.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),  # 0-d stays 0-d
        "head.bias": rng.standard_normal(5)[::2],  # float64, not contiguous
    }
    recipe = TrainRecipe(local_steps=3, lr=1e-4, grad_clip=None, variance_focus=0.5, seed=-4)
    task = TrainTask(
        state=state,
        hook="scaffold",
        hook_params={"lr": 0.01},
        hook_state={"c": {"conv.weight": state["conv.weight"] * 2}},
        recipe=recipe,
    )
    back, cid, rnd = content_to_task(task_to_content(task, cid="robot 1", rnd=4))
    assert (cid, rnd, back.hook, back.hook_params, back.recipe) == (
        "robot 1",
        4,
        "scaffold",
        {"lr": 0.01},
        recipe,
    )
    _same(dict(back.state), state)
    _same(dict(back.hook_state["c"]), {"conv.weight": state["conv.weight"] * 2})
    assert recipe_from_config(ConfigRecord({"cid": "x"})) is None  # a task without a recipe

    update = ClientUpdate("robot 1", state, 12, 3, {"c_delta": {"w": np.ones(2)}}, {"loss": 0.5})
    got, seconds = content_to_update(update_to_content(update, seconds=1.5))
    assert (got.cid, got.num_samples, got.num_steps, got.metrics, seconds) == (
        "robot 1",
        12,
        3,
        {"loss": 0.5},
        1.5,
    )
    _same(dict(got.state), state)
    _same(dict(got.extra["c_delta"]), {"w": np.ones(2)})


# -- bad input -------------------------------------------------------------------------------
def test_the_run_config_refuses_an_unknown_strategy_cl_and_unknown_keys() -> None:
    with pytest.raises(RunConfigError, match="unknown strategy 'fedsgd'; known: "):
        settings_from_run_config({"methods": "fedavg,fedsgd"})
    with pytest.raises(RunConfigError, match="'cl' trains one pooled participant"):
        settings_from_run_config({"methods": "cl"})
    with pytest.raises(RunConfigError, match="unknown run config key"):
        settings_from_run_config({"method": "fedavg"})
    with pytest.raises(RunConfigError, match="scaffold aggregate"):
        settings_from_run_config({"methods": "fedepth,scaffold", "robust-aggregation": "median"})
    settings = settings_from_run_config({"methods": "scaffold,pacfl", "rounds": 2})
    assert settings.spec.methods == ("scaffold", "pacfl") and settings.spec.sim.rounds == 2
    assert settings.spec.transport == "flower"


def _described(msg: Message, cid: str, partition: int, dim: int, samples: int) -> Message:
    info = ClientInfo(
        cid,
        samples,
        Descriptor(mean=np.full(dim, float(partition)), var=np.ones(dim), num_frames=4),
        labels={"platform": "car"},
    )
    return Message(info_to_content(info, partition=partition, summaries=()), reply_to=msg)


def _trained(msg: Message, value: float, samples: int) -> Message:
    task, cid, _ = content_to_task(msg.content)
    state = {k: np.full_like(v, value) for k, v in task.state.items()}
    update = ClientUpdate(cid, state, samples, 1, metrics={"loss": 1.0})
    return Message(update_to_content(update, seconds=0.1), reply_to=msg)


@pytest.fixture
def serverapp_identity() -> Iterator[None]:
    """What Flower's runtime sets in a ServerApp's process before it makes messages (its run,
    node and task ids), for the bridge's messages made here, outside a runtime."""
    from flwr.supercore.task_identity import TaskIdentity

    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before


@pytest.mark.usefixtures("serverapp_identity")
def test_bad_nodes_are_named_and_left_out_and_the_federation_goes_on(
    smoke_hpe: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = FedepthStrategy(create_strategy("fedavg"), CFG, data_dir=str(smoke_hpe))
    initial = state_to_record({"w": np.zeros(3, dtype=np.float32)})
    nodes = [11, 12, 13, 14, 15]
    ask = {m.metadata.dst_node_id: m for m in bridge.configure_describe(nodes, initial)}
    # node 15 runs the real ClientApp with a partition beyond the scenario's four clients
    context = Context(1, 15, {"partition-id": 9, "num-partitions": 10}, RecordDict(), {})
    replies = [
        _described(ask[11], "a", 0, 8, 10),
        _described(ask[12], "b", 1, 8, 30),
        _described(ask[13], "c", 2, 6, 10),  # another encoder's descriptor
        _described(ask[14], "d", 3, 8, 20),
        client_app.app(ask[15], context),
    ]
    with caplog.at_level(logging.ERROR, logger="flwr.fedepth"):
        bridge.aggregate_describe(nodes, replies, initial)
    assert bridge.members == ["a", "b", "d"]
    assert sorted(bridge.excluded) == [13, 15]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        f"node 15: partition 9 is empty: the scenario at {smoke_hpe} has 4 training clients "
        "(partitions 0 to 3); left out of the run",
        "node 13 (partition 2): client 'c': descriptor has 6 dimensions but the fleet's have "
        "8: compute it with the same encoder as the other nodes; left out of the run",
    ]

    caplog.clear()
    asked = bridge.configure_train(1, ArrayRecord(), ConfigRecord({"note": "x"}), NO_GRID)
    train = {m.metadata.dst_node_id: m for m in asked}
    assert sorted(train) == [11, 12, 14]  # only the fleet's nodes
    assert recipe_from_config(train[11].content.config_records[CONFIG]) == CFG.recipe(0)
    assert train[11].content.config_records[CONFIG]["note"] == "x"
    nan = _trained(train[14], float("nan"), 20)  # the bounds reject non-finite updates
    error = Message(Error(2, "the robot ran out of memory"), reply_to=train[12])
    with caplog.at_level(logging.ERROR, logger="flwr.fedepth"):
        _, metrics = bridge.aggregate_train(1, [_trained(train[11], 2.0, 10), error, nan])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert errors[0].startswith("round 1: node 12 (client b, partition 1): the robot ran out")
    assert errors[1].startswith("round 1: node 14 (client d, partition 3): ")
    assert "left out of the round" in errors[1]
    assert metrics is not None and metrics["accepted"] == 1 and metrics["left-out"] == 2
    np.testing.assert_array_equal(bridge.algorithm.model_for("b")["w"], np.full(3, 2.0))

    # the next round goes on with every fleet node; two accepted: (2 * 10 + 5 * 30) / 40
    asked = bridge.configure_train(2, ArrayRecord(), ConfigRecord(), NO_GRID)
    train = {m.metadata.dst_node_id: m for m in asked}
    bridge.aggregate_train(2, [_trained(train[11], 2.0, 10), _trained(train[12], 5.0, 30)])
    np.testing.assert_allclose(bridge.algorithm.model_for("d")["w"], np.full(3, 4.25))


# -- the Flower runtimes ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path) -> dict[str, str]:
    """The environment of Flower's processes: this interpreter's scripts first, a private
    FLWR_HOME, no runtime dependency installation (nothing is fetched), one OpenMP thread."""
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        FLWR_HOME=str(home),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        OMP_NUM_THREADS="1",
        OMP_WAIT_POLICY="PASSIVE",
    )
    env.pop("RAY_ADDRESS", None)
    return env


@contextmanager
def _processes(logs: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started inside are ended (their whole process group) on the way out."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _start(
    procs: list[subprocess.Popen[bytes]], cmd: list[str], log: Path, env: dict[str, str]
) -> None:
    with open(log, "wb") as out:
        procs.append(
            subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )


def _superlink(
    procs: list[subprocess.Popen[bytes]], home: Path, env: dict[str, str], *, simulation: bool
) -> int:
    """A SuperLink on loopback (insecure) that ``flwr run`` reaches as its default connection."""
    port = _free_port()
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "test"\n\n'
        f'[superlink.test]\naddress = "127.0.0.1:{port}"\ninsecure = true\n',
        encoding="utf-8",
    )
    cmd = [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--simulation"] if simulation else ["--disable-runtime-dependency-installation"]
    _start(procs, cmd, home / "superlink.log", env)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return port
        assert procs[-1].poll() is None, (home / "superlink.log").read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError("the SuperLink did not open its port in 60 s")


def _run_config(**values: Any) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in values.items())


def _flwr_run(
    procs: list[subprocess.Popen[bytes]],
    env: dict[str, str],
    run_config: str,
    federation_config: str | None,
    log: Path,
) -> subprocess.Popen[bytes]:
    """``flwr run`` of the example App against the SuperLink, streaming its logs to ``log``."""
    cmd = [str(BIN / "flwr"), "run", str(APP), "--stream", "--run-config", run_config]
    if federation_config:
        cmd += ["--federation-config", federation_config]
    _start(procs, cmd, log, env)
    return procs[-1]


def _finished(run: subprocess.Popen[bytes], log: Path, timeout_s: float) -> str:
    """The output of a ``flwr run`` that ended well within ``timeout_s``."""
    try:
        code = run.wait(timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    output = log.read_text(encoding="utf-8", errors="replace")
    assert code == 0, f"flwr run: exit status {code}\n{output[-5000:]}"
    return output


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The initial checkpoint (the smoke model, ImageNet encoder), so no run pretrains."""
    path = tmp_path_factory.mktemp("flower-weights") / "initial.safetensors"
    save_weights(initial_model(CFG), path)
    return path


@pytest.mark.slow
def test_flwr_run_in_simulation_gives_the_in_process_benchmark_clusters_and_weights(
    smoke_hpe: Path, weights: Path, tmp_path: Path
) -> None:
    out = tmp_path / "flower"
    env = _env(tmp_path / "flwr-home")
    run_config = _run_config(
        **{"data-dir": str(smoke_hpe), "cache-dir": str(tmp_path / "cache")},
        out=str(out),
        weights=str(weights),
        methods=",".join(METHODS),
    )
    scenario = load_scenario(smoke_hpe)
    with _processes(tmp_path) as procs:
        _superlink(procs, tmp_path / "flwr-home", env, simulation=True)
        # one node more than the scenario's four clients: its partition is empty
        federation = "num-supernodes=5 client-resources-num-cpus=2"
        run = _flwr_run(procs, env, run_config, federation, tmp_path / "flwr-run.log")
        # meanwhile, the in-process benchmark: the same fleet, initial weights and config
        model = initial_model(CFG, str(weights))
        fleet = prepare_fleet(scenario, model, CFG, progress=False)
        sim = Simulation(fleet, get_state(model), CFG, SequentialExecutor())
        local = {m: sim.run(m, progress=False) for m in METHODS}
        output = _finished(run, tmp_path / "flwr-run.log", timeout_s=900)
    assert "partition 4 is empty" in output and "left out of the run" in output
    results = json.loads((out / "results.json").read_text())
    assert results["transport"] == "flower" and (out / "report.md").is_file()
    for method, run_here in local.items():
        assert isinstance(run_here.strategy, ClusteredStrategy)
        _, states = run_here.strategy.state_dict()
        flat = {f"{g}/{n}": np.asarray(a) for g, s in states.items() for n, a in s.items()}
        remote = load_file(str(out / "flower" / "seed0" / f"{method}.safetensors"))
        assert set(remote) == set(flat)
        _same(flat, {k: remote[k] for k in flat})  # every cluster model, bit for bit
        got, want = results["methods"][method], run_here.summary()
        assert got["clusters"] == want["clusters"]
        assert got["params"] == want["params"]  # FeDepth's tau from the nodes' descriptors
        for key in ("abs_rel", "sq_rel", "rmse", "rmse_log", "d1", "d2", "d3", "curves"):
            assert got[key] == want[key], key
        assert got["flower"]["nodes"] == 4 and len(got["flower"]["left_out_of_run"]) == 1
    assert len(results["methods"]["fedepth"]["clusters"]) > 1  # soft clusters, not one model
    scenario.close()


@pytest.mark.slow
@pytest.mark.skipif(
    not (BIN / "flower-supernode").is_file(), reason="this flwr has no flower-supernode"
)
@pytest.mark.skipif(
    os.environ.get("FEDEPTH_TEST_FLOWER_DEPLOYMENT") != "1",
    reason="3-4 min (a fresh flwr-clientapp process per message, each importing torch), past "
    "the suite's 20-minute budget on a 2-core CI machine: make test-flower-deployment",
)
def test_the_app_runs_on_the_deployment_runtime_with_two_supernodes(
    smoke_hpe: Path, weights: Path, tmp_path: Path
) -> None:
    out = tmp_path / "flower"
    home = tmp_path / "flwr-home"
    env = _env(home)
    with _processes(tmp_path) as procs:
        port = _superlink(procs, home, env, simulation=False)
        for i in range(2):
            node_config = (
                f"partition-id={i} num-partitions=2 data-dir={json.dumps(str(smoke_hpe))}"
            )
            _start(
                procs,
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--port",
                    str(_free_port()),
                    "--node-config",
                    node_config,
                ],
                tmp_path / f"supernode{i}.log",
                env,
            )
        run_config = _run_config(
            **{"data-dir": str(smoke_hpe), "cache-dir": str(tmp_path / "cache")},
            out=str(out),
            weights=str(weights),
            methods="fedavg",
            rounds=1,
            **{"min-nodes": 2, "node-wait-s": 120.0},
        )
        run = _flwr_run(procs, env, run_config, None, tmp_path / "flwr-run.log")
        _finished(run, tmp_path / "flwr-run.log", timeout_s=900)
    results = json.loads((out / "results.json").read_text())
    fedavg = results["methods"]["fedavg"]
    assert results["transport"] == "flower" and fedavg["flower"]["nodes"] == 2
    scenario = load_scenario(smoke_hpe)
    assert fedavg["flower"]["clients"] == [c.name for c in scenario.clients[:2]]
    scenario.close()
    assert np.isfinite(fedavg["abs_rel"]) and (out / "report.md").is_file()
