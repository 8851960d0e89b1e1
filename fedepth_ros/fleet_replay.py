"""``fedepth fleet replay``: a fleet benchmarked through the real ROS nodes, replaying bags.

ROS-free itself: it starts executables and watches them. For every method it starts a real
``fedepth-coordinator`` (the served model's card, the benchmark profile's training recipe, the
same initial weights as ``fedepth bench``), then for every client one ``robot_node`` fed by one
``bag_player`` replaying the client's bag, in the client's namespace, with at most
``max_robots`` robot processes alive at once (see :class:`Scheduler`), until the coordinator
has run every round. Then each test sequence's bag is played into a ``depth_node`` (routed by
the coordinator), whose every published depth image a ``depth_scorer`` scores against the
bag's depth. Results come out in the benchmark's format (results.json, report.md, figures via
:mod:`fedepth.bench`) plus the replay's own figures (frames, latency).

Loss-free mode (the default, ``lossless``): players, nodes and scorer use reliable KEEP_ALL QoS
end to end (:func:`fedepth_ros.node_common.stream_qos`), the player waits for the robot's
subscriptions before it plays and for its acknowledgements at the end, and the robot joins only
once every frame of its bag is buffered (``join_frames``), so it buffers exactly the frames
``fedepth bench`` trains on, registers the same sample count and computes the same descriptor.

State lives under ``OUT/state/<method>/`` (coordinator state, logs, scores): the same command
continues where an interrupted one stopped (a coordinator restarts from its durable state; the
robots re-join, which is idempotent; finished methods and scored sequences are kept).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.bench import BenchSpec, FleetSummary, combine_seeds, render_report, sim_config
from fedepth.bench.figures import write_figures
from fedepth.bench.inputs import ensure_weights
from fedepth.data.bags import BagError, bag_info
from fedepth.runstate import write_json_atomic, write_text_atomic
from fedepth.sim import (
    MethodRun,
    RoundRecord,
    SimConfig,
    config_dict,
    eval_indices,
    final_metrics,
    strategy_outputs,
)
from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.benchresults import load_final_strategy
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient, open_channel
from fedepth_coordinator.config import config_from_dict
from fedepth_coordinator.domain import FleetStatus, Phase
from fedepth_coordinator.simulate import CoordinatorProcess
from fedepth_coordinator.state import open_store

#: The principal the driver watches the coordinator as.
OPERATOR = "replay-operator"
BAGS_MANIFEST = "bags.json"
_POLL_S = 0.25
_NO_DEADLINE_S = 30 * 24 * 3600.0
#: Methods whose robots keep hook state between rounds (lost when a robot process restarts).
STATEFUL = frozenset({"scaffold", "feddyn"})


class ReplayError(RuntimeError):
    """The replay cannot go on; the message says why and where the logs are."""


# ------------------------------------------------------------------------------------ bags


@dataclass(frozen=True)
class BagEntry:
    """One bag of the replay: a client's (training) or a test sequence's."""

    name: str
    bag: Path
    frames: int
    platform: str = ""
    environment: str = ""
    #: what is wrong with the bag ("" = usable)
    problem: str = ""


def check_bag(path: Path, *, need_depth: bool = True) -> tuple[int, str]:
    """(image frames, problem) of a bag: a missing /image, /depth or /camera_info, or an
    unreadable bag, is a one-line problem ("" when usable)."""
    try:
        info = bag_info(path)
    except BagError as exc:
        return 0, str(exc)
    topics = {t.name.lstrip("/"): t.count for t in info.topics}
    wanted = ["image", "camera_info"] + (["depth"] if need_depth else [])
    missing = [t for t in wanted if not topics.get(t)]
    if missing:
        return topics.get("image", 0), f"bag {path} has no /{', /'.join(missing)} messages"
    return topics["image"], ""


def _stamped_frames(seqs: Sequence[Any], rate_hz: float) -> Any:
    """The frames of ``seqs`` in order with strictly increasing stamps: a sequence without
    increasing stamps (NYUv2) gets ``index x period``; the next sequence starts one period
    after the previous one ends."""
    period = round(1e9 / rate_hz)
    offset = 0
    last = -1
    for seq in seqs:
        synthetic = seq.meta.source == "nyu" or (
            len(seq) > 1 and seq[1].stamp_ns <= seq[0].stamp_ns
        )
        for i, frame in enumerate(seq):
            stamp = i * period if synthetic else int(frame.stamp_ns)
            stamp += offset
            if stamp <= last:
                offset += last + period - stamp
                stamp = last + period
            last = stamp
            yield replace(frame, stamp_ns=stamp)


def write_scenario_bags(scenario_dir: Path, out: Path, rate_hz: float = 10.0) -> Path:
    """Each client's sequences (one bag per client, sequences in order) and each test
    sequence as bags under ``out`` with ``bags.json``; bags written before are kept."""
    from fedepth.data.bag_writer import write_rgbd_bag
    from fedepth.data.scenario import load_scenario

    scenario = load_scenario(scenario_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries: dict[str, list[dict[str, Any]]] = {"clients": [], "test": []}

    def one(kind: str, name: str, seqs: Sequence[Any], platform: str, env: str) -> None:
        path = out / kind / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        if not (path / "metadata.yaml").is_file():
            tmp = path.with_name(path.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            meta = seqs[0].meta
            write_rgbd_bag(
                _stamped_frames(seqs, rate_hz),
                tmp,
                custom_data={
                    "fedepth.source": meta.source,
                    "fedepth.sequence": name,
                    "fedepth.platform": platform,
                    "fedepth.environment": env,
                    "fedepth.split": meta.split,
                    "fedepth.min_depth": f"{meta.min_depth:g}",
                    "fedepth.max_depth": f"{meta.max_depth:g}",
                },
                progress=False,
                total=sum(len(s) for s in seqs),
            )
            tmp.rename(path)
        entries[kind].append(
            {
                "name": name,
                "bag": str(path.relative_to(out)),
                "frames": sum(len(s) for s in seqs),
                "platform": platform,
                "environment": env,
            }
        )

    try:
        for c in scenario.clients:
            one("clients", c.name, c.sequences, c.platform, c.environment)
        for s in scenario.test:
            one("test", s.name, [s], s.meta.platform, s.meta.environment)
    finally:
        scenario.close()
    manifest = {
        "format": "fedepth-replay-bags",
        "scenario": scenario.name,
        "profile": scenario.profile,
        "seed": scenario.seed,
        "scenario_dir": str(Path(scenario_dir).resolve()),
        **entries,
    }
    write_json_atomic(out / BAGS_MANIFEST, manifest)
    return out


def read_bags(bag_dir: Path) -> tuple[dict[str, Any], list[BagEntry], list[BagEntry]]:
    """The manifest, client bags and test bags of a bag directory, each bag checked."""
    path = bag_dir / BAGS_MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{path}: cannot read the bag manifest ({exc})") from None

    def entries(kind: str, need_depth: bool) -> list[BagEntry]:
        out = []
        for e in manifest.get(kind, []):
            bag = (bag_dir / e["bag"]).resolve()
            frames, problem = check_bag(bag, need_depth=need_depth)
            out.append(
                BagEntry(
                    str(e["name"]),
                    bag,
                    frames or int(e.get("frames", 0)),
                    str(e.get("platform", "")),
                    str(e.get("environment", "")),
                    problem,
                )
            )
        return out

    return manifest, entries("clients", True), entries("test", True)


def robot_id_of(name: str) -> str:
    """A client's robot id: its name in the id alphabet (sorting the ids of a generated
    scenario keeps its client order, which the coordinator's aggregation order follows)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


# ------------------------------------------------------------------------------- processes


def _peak_rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _die_with_parent() -> None:
    """In a child, before exec: SIGTERM when the driver dies (Linux), so that no node outlives
    a driver that was killed without the chance to stop it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Child:
    """One child process (its own session: a terminal's Ctrl-C reaches only the driver, which
    stops the children in order), logging to a file."""

    def __init__(self, name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str]) -> None:
        self.name, self.log = name, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(cmd),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.peak_rss = 0
        self.stopping = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def sample_memory(self) -> None:
        if self.alive():
            self.peak_rss = max(self.peak_rss, _peak_rss(self.proc.pid))

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGINT (the nodes shut down cleanly), SIGKILL after ``timeout_s``."""
        self.stopping = True
        self.sample_memory()
        if self.alive():
            try:
                self.proc.send_signal(signal.SIGINT)
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            except ProcessLookupError:
                pass
        return int(self.proc.returncode if self.proc.returncode is not None else -1)


def stop_all(children: Sequence[Child], timeout_s: float = 20.0) -> None:
    """SIGINT to every child at once, then wait for each (SIGKILL after ``timeout_s``)."""
    for child in children:
        child.stopping = True
        child.sample_memory()
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGINT)
    end = time.monotonic() + timeout_s
    for child in children:
        try:
            child.proc.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()


def _node(module: str) -> list[str]:
    return [sys.executable, "-m", f"fedepth_ros.{module}"]


def _params(params: Mapping[str, Any]) -> list[str]:
    out = []
    for k, v in params.items():
        if isinstance(v, bool):
            text = "true" if v else "false"
        elif isinstance(v, str) and v == "":
            text = "''"
        else:
            text = str(v)
        out += ["-p", f"{k}:={text}"]
    return out


# ------------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class ReplaySpec:
    """What ``fedepth fleet replay`` runs."""

    methods: tuple[str, ...]
    out: Path
    max_robots: int
    rounds: int | None = None
    scenario_dir: Path | None = None
    bag_dir: Path | None = None
    backbone: str = "newcrfs-lite"
    cache_dir: Path = Path(".cache/fedepth")
    weights: Path | None = None
    image_size: tuple[int, int] | None = None
    local_steps: int | None = None
    rate: float = 20.0
    lossless: bool = True
    round_deadline_s: float = 0.0
    quorum: float = 1.0
    robot_retries: int = 1
    coordinator_restarts: int = 1
    start_timeout_s: float = 600.0
    progress: bool = True


@dataclass
class RobotState:
    """What the driver knows of one robot over a method's run."""

    rid: str
    entry: BagEntry
    starts: int = 0
    failures: int = 0
    dropped_at: str | None = None
    peak_rss: list[int] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)


# ------------------------------------------------------------------------------ scheduler


class Scheduler:
    """At most ``max_robots`` robot processes alive; which robots run when.

    A robot has work while the coordinator still needs something from it: before the fleet
    forms, its registration and descriptor; in an open round that selected it, its update.
    Every poll, robots with work that are not running are started (in fleet order) while a
    slot is free; when none is free, a running robot without work (enrolled, or reported for
    the open round) is stopped to free one. A robot keeps running as long as no one waits for
    its slot, so with ``max_robots`` >= the fleet no robot ever restarts, and otherwise the
    robots still running when a round closes are the first of the next round: each round
    restarts ``fleet - max_robots`` robots. A restarted robot replays its bag again and
    re-joins with the same sample count and descriptor (idempotent at the coordinator).
    """

    def __init__(self, order: Sequence[str], max_robots: int) -> None:
        self.order = list(order)
        self.max_robots = max_robots

    def decide(
        self, work: set[str], running: Sequence[str], excluded: set[str]
    ) -> tuple[list[str], list[str]]:
        """(robots to start, robots to stop) now."""
        waiting = [r for r in self.order if r in work and r not in running and r not in excluded]
        idle = [r for r in running if r not in work]
        free = max(0, self.max_robots - len(running))
        stop = idle[: max(0, len(waiting) - free)]
        return waiting[: free + len(stop)], stop


def robots_with_work(status: FleetStatus) -> set[str]:
    """The robots the coordinator waits for now (see :class:`Scheduler`)."""
    if status.phase is Phase.FINISHED:
        return set()
    if status.phase is Phase.WAITING_FOR_FLEET:
        return {r.robot_id for r in status.robots if not r.has_descriptor} | {"*enrol*"}
    return {r.robot_id for r in status.robots if r.selected and not r.reported}


# ------------------------------------------------------------------------------- the run


class FleetReplay:
    """One ``fedepth fleet replay``: every method, then results, report and figures."""

    def __init__(self, spec: ReplaySpec, echo: Callable[[str], None] = print) -> None:
        self.spec = spec
        self.echo = echo
        self.out = spec.out.resolve()
        self.env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, self.env.get("PYTHONPATH")) if p
        )
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.children: list[Child] = []
        self._prestarted: dict[int, tuple[Child, Child]] = {}
        self.t0 = time.perf_counter()

    # -- inputs ------------------------------------------------------------------------------
    def prepare(self) -> None:
        s = self.spec
        self.out.mkdir(parents=True, exist_ok=True)
        if s.bag_dir is not None:
            bag_dir = s.bag_dir.resolve()
        else:
            assert s.scenario_dir is not None
            bag_dir = self.out / "bags"
            self.echo(f"writing the scenario's bags into {bag_dir} (kept for later runs)")
            write_scenario_bags(s.scenario_dir, bag_dir)
        self.bag_dir = bag_dir
        manifest, clients, tests = read_bags(bag_dir)
        self.manifest = manifest
        self.missing: list[str] = []
        for e in clients + tests:
            if e.problem:
                self.echo(f"{e.name}: {e.problem}: left out of the replay")
                self.missing.append(f"{e.name}: {e.problem}")
        self.clients = [e for e in clients if not e.problem]
        self.tests = [e for e in tests if not e.problem]
        if len(self.clients) < 1:
            raise ReplayError(f"{bag_dir}: no usable client bag")
        scenario = str(manifest.get("scenario") or "hpe")
        profile = str(manifest.get("profile") or "small")
        seed = int(manifest.get("seed", 0))
        self.config: SimConfig = sim_config(
            scenario,
            profile,
            model=s.backbone,
            seed=seed,
            rounds=s.rounds,
            local_steps=s.local_steps,
            image_size=s.image_size,
        )
        self.scenario, self.profile, self.seed = scenario, profile, seed
        self.ids = [robot_id_of(e.name) for e in self.clients]
        if len(set(self.ids)) != len(self.ids):
            raise ReplayError("two clients have the same robot id after sanitizing their names")
        if self.ids != sorted(self.ids):
            self.echo(
                "note: the clients' order is not their ids' order; the coordinator aggregates "
                "in id order, so numbers may differ from `fedepth bench` in the last digits"
            )
        self.weights = self._weights()
        self._initial_file()

    def _weights(self) -> Path:
        s = self.spec
        if s.weights is not None:
            return s.weights.resolve()
        data = s.scenario_dir or Path(str(self.manifest.get("scenario_dir", "")))
        if not (data / "manifest.json").is_file():
            raise ReplayError(
                "the initial weights come from pretraining on the scenario: give --weights "
                "with --bags whose manifest names no scenario directory"
            )
        from fedepth.data.scenario import load_scenario

        spec = BenchSpec(
            scenario=self.scenario,
            profile=self.profile,
            methods=self.spec.methods,
            out=self.out,
            sim=self.config,
            data_dir=data,
            cache_dir=s.cache_dir,
            progress=s.progress,
        )
        scenario = load_scenario(data)
        try:
            return ensure_weights(spec, scenario).resolve()
        finally:
            scenario.close()

    def _initial_file(self) -> None:
        """The served weights with their model card (as the gRPC benchmark serves them)."""
        from safetensors.numpy import save_file

        from fedepth.models import get_state
        from fedepth.models.card import CARD_KEY, ModelCard
        from fedepth.sim import initial_model

        c = self.config
        model = initial_model(c, str(self.weights))
        self.initial = {k: np.asarray(v, order="C") for k, v in get_state(model).items()}
        self.state_bytes = int(sum(v.nbytes for v in self.initial.values()))
        card = ModelCard(
            model=c.model,
            min_depth=c.min_depth,
            max_depth=c.max_depth,
            input_size=(int(c.image_size[0]), int(c.image_size[1])),
        )
        self.initial_path = self.out / "initial.safetensors"
        save_file(self.initial, str(self.initial_path), metadata={CARD_KEY: card.to_json()})

    # -- one method --------------------------------------------------------------------------
    def _tokens(self, sdir: Path, names: Sequence[str]) -> dict[str, str]:
        """Throwaway loopback credentials of this method's run, kept for a resumed run."""
        path = sdir / "tokens.json"
        creds = sdir / "credentials.yaml"
        if path.is_file() and creds.is_file():
            tokens: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
            if set(names) <= set(tokens):
                return tokens
        creds.unlink(missing_ok=True)
        tokens = {}
        for n in names:
            tokens[n] = add_principal(creds, n, "operator" if n == OPERATOR else "robot")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(tokens, f)
        tdir = sdir / "tokens"
        tdir.mkdir(exist_ok=True)
        for n, t in tokens.items():
            (tdir / f"{n}.token").write_text(t, encoding="utf-8")
        return tokens

    def _coordinator(self, method: str, sdir: Path) -> CoordinatorProcess:
        c, s = self.config, self.spec
        n = len(self.ids)
        recipes = {c.recipe(r) for r in range(c.rounds)}
        if len(recipes) != 1:
            raise ReplayError("the recipe changes between rounds; the coordinator sends one")
        deadline = s.round_deadline_s if s.round_deadline_s > 0 else _NO_DEADLINE_S
        cfg = config_from_dict(
            {
                "server": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "max_workers": max(32, 2 * n + 8),
                    "max_wait_s": 5.0,
                    "grace_s": 1.0,
                },
                "auth": {"credentials_file": str(sdir / "credentials.yaml")},
                "rounds": {
                    "num_rounds": c.rounds,
                    "min_robots": n,
                    "fraction": 1.0,
                    "quorum": s.quorum if s.round_deadline_s > 0 else 1.0,
                    "deadline_s": deadline,
                    "seed": c.seed,
                },
                "strategy": {"name": method, "params": dict(c.method_params.get(method, {}))},
                "training": recipes.pop().to_dict(),
                "model": {"initial_weights": str(self.initial_path)},
                "validation": {"max_descriptor_dim": 8192, "max_summary_bytes": 1 << 22},
                "state": {"dir": str(sdir / "coordinator"), "backend": "sqlite"},
                "log_level": "INFO",
            }
        )
        return CoordinatorProcess(cfg, log_path=sdir / "coordinator.log")

    def _robot_cmds(
        self, rid: str, entry: BagEntry, target: str, sdir: Path
    ) -> tuple[list[str], list[str]]:
        c, s = self.config, self.spec
        ns = ["--ros-args", "-r", f"__ns:=/{rid}"]
        qos = "lossless" if s.lossless else "sensor_data"
        robot = (
            _node("robot_node")
            + ns
            + _params(
                {
                    "robot_id": rid,
                    "coordinator": target,
                    "token_file": str(sdir / "tokens" / f"{rid}.token"),
                    "platform": entry.platform,
                    "environment": entry.environment,
                    "threads": 1,
                    "buffer_size": max(1, entry.frames),
                    "frame_stride": 1,
                    "descriptor_frames": c.descriptor_frames,
                    "train_height": int(c.image_size[0]),
                    "train_width": int(c.image_size[1]),
                    "sync_queue_size": entry.frames + 10,
                    "input_qos": qos,
                    "join_frames": entry.frames if s.lossless else 0,
                    "descriptor_seed": c.seed,
                    # the served initial weights: the descriptor's frozen encoder is the
                    # benchmark's (a model built from the card alone is untrained)
                    "weights": str(self.initial_path),
                }
            )
        )
        player = (
            _node("bag_player")
            + ns
            + _params(
                {
                    "bag": str(entry.bag),
                    "rate": s.rate,
                    "lossless": s.lossless,
                    "qos_depth": max(10, entry.frames),
                    "wait_for_subscribers": 1,
                    "wait_timeout": s.start_timeout_s,
                    "ack_timeout": 60.0,
                }
            )
        )
        return robot, player

    def run_method(self, method: str) -> dict[str, Any]:
        s = self.spec
        sdir = self.out / "state" / method
        done = sdir / "summary.json"
        if done.is_file():
            self.echo(f"{method}: finished earlier ({sdir}); kept")
            return dict(json.loads(done.read_text(encoding="utf-8")))
        sdir.mkdir(parents=True, exist_ok=True)
        if method in STATEFUL and s.max_robots < len(self.ids):
            self.echo(
                f"warning: {method}'s robots keep state between rounds, which a restarted robot "
                "process loses; with --max-robots below the fleet the run is not the benchmark's"
            )
        tests = [f"test-{i:03d}" for i in range(len(self.tests))]
        tokens = self._tokens(sdir, [*self.ids, *tests, OPERATOR])
        coordinator = self._coordinator(method, sdir)
        port = coordinator.start(timeout_s=s.start_timeout_s)
        target = f"127.0.0.1:{port}"
        self.echo(f"{method}: coordinator on {target} (state {sdir / 'coordinator'})")
        robots = {rid: RobotState(rid, e) for rid, e in zip(self.ids, self.clients, strict=True)}
        running: dict[str, tuple[Child, Child]] = {}
        restarts = [0]
        t_start = time.perf_counter()
        op = CoordinatorClient(open_channel(target), OPERATOR, tokens[OPERATOR])
        try:
            history = self._rounds(method, sdir, coordinator, op, robots, running, restarts)
            t_rounds = time.perf_counter() - t_start
            self._stop_robots(robots, running, list(running))
            scores = self._test_sequences(method, sdir, target, coordinator, tests)
        finally:
            self._stop_robots(robots, running, list(running))
            for pair in self._prestarted.values():
                stop_all(list(pair))
            self._prestarted = {}
            op.close()
            coordinator.stop()
        summary = self._summary(method, sdir, robots, history, scores, t_rounds, restarts[0])
        write_json_atomic(done, summary)
        return summary

    def _stop_robots(
        self,
        robots: dict[str, RobotState],
        running: dict[str, tuple[Child, Child]],
        rids: Sequence[str],
    ) -> None:
        """Stop several robots at once (each shutdown takes seconds; in parallel)."""
        procs = {rid: running.pop(rid) for rid in rids}
        stop_all([c for pair in procs.values() for c in pair])
        for rid, pair in procs.items():
            self._stop_robot(robots[rid], pair)

    def _stop_robot(self, robot: RobotState, procs: tuple[Child, Child]) -> None:
        node, player = procs
        robot.exits.append(node.stop())
        robot.peak_rss.append(node.peak_rss)
        player.stop(5.0)
        for child in procs:
            if child in self.children:
                self.children.remove(child)

    def _start_robot(self, robot: RobotState, target: str, sdir: Path) -> tuple[Child, Child]:
        robot.starts += 1
        robot_cmd, player_cmd = self._robot_cmds(robot.rid, robot.entry, target, sdir)
        logs = sdir / "logs"
        node = Child(robot.rid, robot_cmd, logs / f"{robot.rid}.robot.log", self.env)
        player = Child(robot.rid, player_cmd, logs / f"{robot.rid}.player.log", self.env)
        self.children += [node, player]
        return node, player

    def _status(
        self,
        op: CoordinatorClient,
        coordinator: CoordinatorProcess,
        method: str,
        sdir: Path,
        restarted: list[int],
    ) -> FleetStatus | None:
        """The fleet status; a coordinator that died is restarted from its state (once)."""
        proc = coordinator.proc
        if proc is not None and proc.poll() is not None:
            code = proc.returncode
            if restarted[0] >= self.spec.coordinator_restarts:
                raise ReplayError(
                    f"{method}: the coordinator exited with status {code} again; see "
                    f"{coordinator.log_path}. Its state is kept: the same command resumes"
                )
            restarted[0] += 1
            self.echo(
                f"{method}: the coordinator exited with status {code} (see "
                f"{coordinator.log_path}); restarting it from its state on the same port"
            )
            coordinator.start(port=coordinator.port, timeout_s=self.spec.start_timeout_s)
        try:
            return op.fleet_status()
        except CoordinatorCallError:
            return None

    def _rounds(
        self,
        method: str,
        sdir: Path,
        coordinator: CoordinatorProcess,
        op: CoordinatorClient,
        robots: dict[str, RobotState],
        running: dict[str, tuple[Child, Child]],
        restarts: list[int],
    ) -> list[Any]:
        s, c = self.spec, self.config
        sched = Scheduler(self.ids, s.max_robots)
        target = f"127.0.0.1:{coordinator.port}"
        pause = threading.Event()
        seen_rounds = -1
        restarted = [0]
        formed = False
        while True:
            status = self._status(op, coordinator, method, sdir, restarted)
            if status is None:
                pause.wait(_POLL_S)
                continue
            target = f"127.0.0.1:{coordinator.port}"
            if not formed and status.phase is not Phase.WAITING_FOR_FLEET:
                formed = True
                self.echo(f"{method}: fleet formed with {len(status.robots)} robots")
            for h in status.history[seen_rounds + 1 :]:
                alive = len(running)
                self.echo(
                    f"{method}: round {h.round + 1}/{c.rounds} closed ({h.closed_by}): "
                    f"{h.accepted}/{h.selected} updates, {h.duration_s:.1f} s; robot "
                    f"processes alive {alive}, restarts so far {restarts[0]}"
                )
                seen_rounds = h.round
            if status.phase is Phase.FINISHED:
                return list(status.history)
            work = robots_with_work(status)
            if "*enrol*" in work:  # not registered yet: everyone without a descriptor
                known = {r.robot_id for r in status.robots}
                work |= {rid for rid in self.ids if rid not in known}
            for rid, (node, _player) in list(running.items()):
                node.sample_memory()
                if node.alive():
                    continue
                robot = robots[rid]
                code = node.proc.returncode
                robot.failures += 1
                self._stop_robot(robot, running.pop(rid))
                log = node.log
                if robot.failures > s.robot_retries:
                    robot.dropped_at = f"round {status.round}" if formed else "enrolment"
                    self.echo(
                        f"{method}: robot {rid} exited with status {code} again ({log}): a "
                        f"drop-out from {robot.dropped_at} on"
                        + (
                            ""
                            if s.round_deadline_s > 0
                            else "; without --round-deadline the round waits for it forever"
                        )
                    )
                else:
                    self.echo(
                        f"{method}: robot {rid} exited with status {code} ({log}):\n"
                        f"{_tail(log, 6)}\nrestarting it"
                    )
            dropped = {rid for rid, r in robots.items() if r.dropped_at}
            start, stop = sched.decide(work, list(running), dropped)
            self._stop_robots(robots, running, stop)
            if status.round == c.rounds - 1 and not self._prestarted:
                self._prestart_tests(sdir, target)
            for rid in start:
                if robots[rid].starts:
                    restarts[0] += 1
                running[rid] = self._start_robot(robots[rid], target, sdir)
            pause.wait(_POLL_S)

    # -- test sequences ----------------------------------------------------------------------
    def _start_test(self, i: int, e: BagEntry, sdir: Path, target: str) -> tuple[Child, Child]:
        """A test sequence's scorer and routed depth_node (its player comes later)."""
        s, c = self.spec, self.config
        qos = "lossless" if s.lossless else "sensor_data"
        ns = ["--ros-args", "-r", f"__ns:=/test{i:03d}"]
        logs, tdir = sdir / "logs", sdir / "test"
        tdir.mkdir(exist_ok=True)
        principal = f"test-{i:03d}"
        scorer_params = {
            "bag": str(e.bag),
            "out": str(tdir / f"{e.name}.json"),
            "timeout": s.start_timeout_s,
            "eval_height": int(c.image_size[0]),
            "eval_width": int(c.image_size[1]),
            "input_qos": qos,
        }
        node_params = {
            "robot_id": principal,
            "coordinator": target,
            "token_file": str(sdir / "tokens" / f"{principal}.token"),
            "descriptor_frames": max(1, min(e.frames, c.descriptor_frames)),
            "threads": 1,
            "output_qos": qos,
            "input_qos": qos,
            "resize_input": True,
            "queue_size": e.frames + 1,
            # the routing descriptor from the served initial weights' encoder, as the
            # benchmark describes its test sequences; every frame waits for the routed model
            "weights": str(self.initial_path),
            "answer_before_routed": False,
        }
        scorer = Child(
            e.name,
            _node("depth_scorer") + ns + _params(scorer_params),
            logs / f"test{i:03d}.scorer.log",
            self.env,
        )
        node = Child(
            e.name,
            _node("depth_node") + ns + _params(node_params),
            logs / f"test{i:03d}.depth.log",
            self.env,
        )
        self.children += [scorer, node]
        return scorer, node

    def _start_test_player(self, i: int, e: BagEntry, sdir: Path) -> Child:
        s = self.spec
        params = {
            "bag": str(e.bag),
            "topics": "/image,/camera_info",
            "rate": s.rate,
            "lossless": s.lossless,
            "qos_depth": max(10, e.frames),
            "wait_for_subscribers": 2,  # the depth node and the scorer
            "wait_timeout": s.start_timeout_s,
            "ack_timeout": 60.0,
        }
        player = Child(
            e.name,
            [*_node("bag_player"), "--ros-args", "-r", f"__ns:=/test{i:03d}", *_params(params)],
            sdir / "logs" / f"test{i:03d}.player.log",
            self.env,
        )
        self.children.append(player)
        return player

    def _prestart_tests(self, sdir: Path, target: str) -> None:
        """During the last round: the first wave's scorers and depth nodes start (imports,
        the served model), so the test phase does not wait for them; their players start
        only once the run finished, so they route with the final models."""
        tdir = sdir / "test"
        todo = [
            (i, e) for i, e in enumerate(self.tests) if not (tdir / f"{e.name}.json").is_file()
        ]
        for i, e in todo[: max(1, self.spec.max_robots)]:
            if i not in self._prestarted:
                self._prestarted[i] = self._start_test(i, e, sdir, target)

    def _test_sequences(
        self,
        method: str,
        sdir: Path,
        target: str,
        coordinator: CoordinatorProcess,
        principals: Sequence[str],
    ) -> dict[str, dict[str, Any]]:
        """Each test sequence's bag into a routed depth_node, scored (in waves of the
        robot slots); sequences scored before are kept."""
        s = self.spec
        tdir = sdir / "test"
        tdir.mkdir(exist_ok=True)
        todo = [
            (i, e) for i, e in enumerate(self.tests) if not (tdir / f"{e.name}.json").is_file()
        ]
        wave_size = max(1, s.max_robots)
        for k in range(0, len(todo), wave_size):
            wave = todo[k : k + wave_size]
            procs = [
                self._prestarted.pop(i)
                if i in self._prestarted
                else self._start_test(i, e, sdir, target)
                for i, e in wave
            ]
            players = [self._start_test_player(i, e, sdir) for i, e in wave]
            for scorer, node in procs:
                try:
                    scorer.proc.wait(s.start_timeout_s + 60)
                except subprocess.TimeoutExpired:
                    scorer.stop()
                node.sample_memory()
            stop_all([c for pair in procs for c in pair] + players)
            for child in [c for pair in procs for c in pair] + players:
                if child in self.children:
                    self.children.remove(child)
            for (_, e), (scorer, node) in zip(wave, procs, strict=True):
                path = tdir / f"{e.name}.json"
                if not path.is_file():
                    self.echo(
                        f"{method}: test {e.name}: the scorer wrote nothing (status "
                        f"{scorer.proc.returncode}; {scorer.log}); left out"
                    )
                    continue
                res = json.loads(path.read_text(encoding="utf-8"))
                res["route"] = _route_of(node.log)
                res["npz"] = str(path.with_suffix(".npz"))
                res["depth_node_peak_rss_bytes"] = node.peak_rss
                write_json_atomic(path, res)
                lat = [r["latency_s"] for r in res["rows"] if r.get("latency_s") is not None]
                rows = [r["native"] for r in res["rows"] if r.get("native")]
                abs_rel = float(np.mean([r["abs_rel"] for r in rows])) if rows else float("nan")
                self.echo(
                    f"{method}: test {e.name}: {res['frames_answered']}/{res['frames_in_bag']} "
                    f"frames answered, abs_rel {abs_rel:.3f}, latency median "
                    f"{(np.median(lat) * 1e3 if lat else float('nan')):.0f} ms, routed to "
                    f"{res['route']}"
                )
        out = {}
        for e in self.tests:
            path = tdir / f"{e.name}.json"
            if path.is_file():
                out[e.name] = json.loads(path.read_text(encoding="utf-8"))
        return out

    # -- results -----------------------------------------------------------------------------
    def _summary(
        self,
        method: str,
        sdir: Path,
        robots: dict[str, RobotState],
        history: list[Any],
        scores: dict[str, dict[str, Any]],
        t_rounds: float,
        restarts: int,
    ) -> dict[str, Any]:
        c = self.config
        params = dict(c.method_params.get(method, {}))
        strategy, rounds_done = load_final_strategy(sdir / "coordinator", method, params)
        store = open_store("sqlite", sdir / "coordinator")
        try:
            snap = store.load()
        finally:
            store.close()
        records = {r.robot_id: r for r in snap.robots}
        losses = _losses(sdir / "logs", self.ids)
        rounds: list[RoundRecord] = []
        for h in history:
            per = [losses.get((rid, h.round)) for rid in self.ids]
            got = [x for x in per if x is not None]
            rounds.append(
                RoundRecord(
                    round=h.round,
                    train_seconds=float(h.duration_s),
                    aggregate_seconds=0.0,
                    wire_seconds=0.0,
                    mean_loss=float(np.mean(got)) if got else float("nan"),
                    download_bytes={rid: self.state_bytes for rid in self.ids},
                    upload_bytes={rid: self.state_bytes for rid in self.ids},
                )
            )
        test, routes, samples, replay_tests = self._test_metrics(scores)
        if rounds and test is not None:
            rounds[-1].test, rounds[-1].routes = test, routes
        final, groups, per_seq = final_metrics(rounds, c.last_rounds)
        clusters, out_params = strategy_outputs(strategy, params)
        run = MethodRun(
            method,
            rounds,
            final,
            per_seq,
            groups,
            clusters,
            0.0,
            0.0,
            samples,
            out_params,
            strategy,
        )
        summary = run.summary()
        summary["transport"] = "ros-replay"
        sent = {rid: r.entry.frames for rid, r in robots.items()}
        buffered = {rid: (records[rid].num_samples if rid in records else 0) for rid in self.ids}
        rss = [m for r in robots.values() for m in r.peak_rss if m]
        summary["replay"] = {
            "rounds_done": rounds_done,
            "rounds_wall_seconds": t_rounds,
            "round_wall_seconds": [float(h.duration_s) for h in history],
            "closed_by": [str(h.closed_by) for h in history],
            "max_robots": self.spec.max_robots,
            "lossless": self.spec.lossless,
            "robot_starts": {rid: r.starts for rid, r in robots.items()},
            "robot_restarts": restarts,
            "dropped": {rid: r.dropped_at for rid, r in robots.items() if r.dropped_at},
            "frames_sent": sent,
            "frames_buffered": buffered,
            "robot_peak_rss_bytes": {
                rid: max(r.peak_rss) if r.peak_rss else 0 for rid, r in robots.items()
            },
            "robot_peak_rss_bytes_max": max(rss) if rss else 0,
            "robot_peak_rss_bytes_mean": float(np.mean(rss)) if rss else 0.0,
            "cluster_members": [[self.ids[i] for i in members] for members in clusters],
            "tests": replay_tests,
        }
        arrays = {f"{k}/{j}": a for k, v in samples.items() for s in v for j, a in enumerate(s)}
        np.savez(sdir / "samples.npz", **arrays)  # type: ignore[arg-type]
        return summary

    def _test_metrics(
        self, scores: dict[str, dict[str, Any]]
    ) -> tuple[
        dict[str, dict[str, float]] | None,
        dict[str, list[int]],
        dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
        dict[str, Any],
    ]:
        """The last round's test metrics in the simulation's layout, from the scorers'
        rows: every published frame at its published size (``all``), and the benchmark's
        evaluation frames at the model's size (``bench_frames``, to compare with it)."""
        c = self.config
        per_seq: dict[str, dict[str, float]] = {}
        groups: dict[str, list[dict[str, float]]] = {}
        routes: dict[str, list[int]] = {}
        samples = {}
        replay: dict[str, Any] = {}
        bench_rows: dict[str, dict[str, float]] = {}
        for e in self.tests:
            res = scores.get(e.name)
            if res is None:
                replay[e.name] = {"missing": "not scored"}
                continue
            rows = [r for r in res["rows"] if r.get("native")]
            lat = [r["latency_s"] for r in res["rows"] if r.get("latency_s") is not None]
            at = set(eval_indices(res["frames_in_bag"], c.eval_frames))
            model_rows = [r["model"] for r in res["rows"] if r.get("model") and r["index"] in at]
            replay[e.name] = {
                "frames_sent": res["frames_in_bag"],
                "frames_seen_by_scorer": res["frames_seen"],
                "frames_answered": res["frames_answered"],
                "missing_stamps": res["missing_stamps"],
                "latency_s": lat,
                "route": res.get("route"),
            }
            if not rows:
                continue
            m = _mean_rows([r["native"] for r in rows])
            per_seq[e.name] = m
            if model_rows:
                bench_rows[e.name] = _mean_rows(model_rows)
            routes[e.name] = list(res.get("route") or [])
            pic = Path(str(res.get("npz", "")))
            if pic.is_file():
                with np.load(pic) as z:
                    samples[e.name] = [(z["rgb"], z["gt"], z["pred"])]
            groups.setdefault(f"platform:{res['platform']}", []).append(m)
            groups.setdefault(f"environment:{res['environment']}", []).append(m)
        if not per_seq:
            return None, routes, samples, replay
        out = {"all": _mean_rows(list(per_seq.values()))}
        out.update({g: _mean_rows(rows) for g, rows in groups.items()})
        out.update({f"seq:{k}": v for k, v in per_seq.items()})
        replay["bench_frames"] = {
            "all": _mean_rows(list(bench_rows.values())) if bench_rows else None,
            "per_sequence": bench_rows,
            "eval_frames": c.eval_frames,
            "size": list(c.image_size),
        }
        return out, routes, samples, replay

    # -- everything --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Every method, then the outputs. SIGTERM is handled like Ctrl-C: every child is
        stopped, the state stays resumable."""

        def on_term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        main_thread = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, on_term) if main_thread else None
        try:
            self.prepare()
            summaries = {m: self.run_method(m) for m in self.spec.methods}
        finally:
            self.close()
            if main_thread:
                signal.signal(signal.SIGTERM, old)
        return self.write(summaries)

    def close(self) -> None:
        """Stop every child still running (Ctrl-C, an error): the state stays resumable."""
        stop_all(self.children)
        self.children = []

    def write(self, summaries: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        c = self.config
        methods = {m: combine_seeds({str(self.seed): summaries[m]}) for m in summaries}
        results = {
            "scenario": self.scenario,
            "profile": self.profile,
            "seed": self.seed,
            "seeds": {
                str(self.seed): {"data_dir": str(self.bag_dir), "weights": str(self.weights)}
            },
            "backbone": c.model,
            "data_dir": str(self.spec.scenario_dir or self.bag_dir),
            "weights": str(self.weights),
            "num_clients": len(self.clients),
            "num_test_sequences": len(self.tests),
            "transport": "ros-replay",
            "methods": methods,
            "overlap_sweep": {},
            "wall_seconds": time.perf_counter() - self.t0,
            "replay": {
                "bags": str(self.bag_dir),
                "max_robots": self.spec.max_robots,
                "lossless": self.spec.lossless,
                "missing": self.missing,
                "config": config_dict(c),
            },
        }
        write_json_atomic(
            self.out / "config.json", {"sim": config_dict(c), "spec": _spec(self.spec)}
        )
        write_json_atomic(self.out / "results.json", results)
        fleet = self._fleet_summary()
        pictures = {m: _load_samples(self.out / "state" / m / "samples.npz") for m in summaries}
        write_figures(self.out, fleet, {m: [summaries[m]] for m in summaries}, pictures)
        write_replay_figures(self.out, summaries)
        write_text_atomic(self.out / "report.md", render_report(results) + replay_report(results))
        return results

    def _fleet_summary(self) -> FleetSummary:
        """The robots' descriptors as the coordinator recorded them (the first method's)."""
        m = self.spec.methods[0]
        store = open_store("sqlite", self.out / "state" / m / "coordinator")
        try:
            recs = {r.robot_id: r for r in store.load().robots}
        finally:
            store.close()
        have = [rid for rid in self.ids if rid in recs and recs[rid].descriptor is not None]
        descs = [recs[rid].descriptor for rid in have]
        return FleetSummary(
            data_dir=str(self.bag_dir),
            weights=str(self.weights),
            clients=[
                {
                    "name": rid,
                    "platform": recs[rid].labels.get("platform", ""),
                    "environment": recs[rid].labels.get("environment", ""),
                }
                for rid in have
            ],
            test=[e.name for e in self.tests],
            means=np.stack([d.mean for d in descs if d is not None]),
            variances=np.stack([d.var for d in descs if d is not None]),
        )


def _spec(spec: ReplaySpec) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.__dict__.items()}


def _mean_rows(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


_LOSS = re.compile(r"round (\d+): loss ([0-9.eE+-]+|nan); uploading")
_ROUTE = re.compile(r"routed \d+ frames to clusters \[([0-9, ]*)\]")


def _losses(logs: Path, ids: Sequence[str]) -> dict[tuple[str, int], float]:
    """Each robot's training loss per round, from its log (the last attempt of a round)."""
    out: dict[tuple[str, int], float] = {}
    for rid in ids:
        path = logs / f"{rid}.robot.log"
        if not path.is_file():
            continue
        for m in _LOSS.finditer(path.read_text(encoding="utf-8", errors="replace")):
            out[(rid, int(m.group(1)))] = float(m.group(2))
    return out


def _route_of(log: Path) -> list[int] | None:
    try:
        found = _ROUTE.findall(log.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    if not found:
        return None
    return [int(x) for x in found[-1].split(",") if x.strip()]


def _load_samples(path: Path) -> dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    if not path.is_file():
        return {}
    out: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    with np.load(path) as z:
        names = sorted({k.rsplit("/", 1)[0] for k in z.files})
        for n in names:
            out[n] = [(z[f"{n}/0"], z[f"{n}/1"], z[f"{n}/2"])]
    return out


def write_replay_figures(out: Path, summaries: Mapping[str, Mapping[str, Any]]) -> None:
    """replay_frames.png (frames sent / buffered / answered) and replay_latency.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(summaries.values()))["replay"]
    robots = list(first["frames_sent"])
    tests = [t for t, v in first["tests"].items() if t != "bench_frames" and "frames_sent" in v]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [2, 1]})
    x = np.arange(len(robots))
    axes[0].bar(x - 0.2, [first["frames_sent"][r] for r in robots], 0.4, label="sent (bag)")
    axes[0].bar(x + 0.2, [first["frames_buffered"][r] for r in robots], 0.4, label="buffered")
    axes[0].set_xticks(x, [r[:14] for r in robots], rotation=90, fontsize=6)
    axes[0].set_title("robots: frames sent by the player / buffered by robot_node")
    axes[0].legend(fontsize=7)
    xt = np.arange(len(tests))
    width = 0.8 / (1 + len(summaries))
    axes[1].bar(
        xt - 0.4 + width / 2,
        [first["tests"][t]["frames_sent"] for t in tests],
        width,
        label="sent",
    )
    for j, (m, s) in enumerate(summaries.items()):
        axes[1].bar(
            xt - 0.4 + width * (j + 1.5),
            [s["replay"]["tests"].get(t, {}).get("frames_answered", 0) for t in tests],
            width,
            label=f"answered ({m})",
        )
    axes[1].set_xticks(xt, [t[:14] for t in tests], rotation=90, fontsize=6)
    axes[1].set_title("test sequences: frames sent / depth answered")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "replay_frames.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for m, s in summaries.items():
        lat = [v for t in tests for v in s["replay"]["tests"].get(t, {}).get("latency_s", [])]
        if lat:
            v = np.sort(np.asarray(lat) * 1e3)
            ax.plot(v, np.arange(1, v.size + 1) / v.size, label=m)
    ax.set(
        xlabel="image -> depth latency (ms)",
        ylabel="fraction of frames",
        title="depth_node latency (seen by the scorer)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "replay_latency.png", dpi=110)
    plt.close(fig)


def replay_report(results: Mapping[str, Any]) -> str:
    """The replay's section of report.md."""
    r = results["replay"]
    mode = (
        "loss-free (reliable, keep-all QoS end to end)"
        if r["lossless"]
        else "sensor-data QoS (lossy)"
    )
    lines = [
        "",
        "## Fleet replay through the ROS nodes",
        "",
        f"Transport `ros-replay`: bags in `{r['bags']}`, at most {r['max_robots']} robot "
        f"processes at once, {mode}. "
        "The tables above score every depth image `depth_node` published after the last "
        "round at its published size against the bag's depth; `bench frames` below are the "
        "benchmark's evaluation frames at the model's size, comparable with `fedepth bench`.",
        "",
        "| Method | rounds wall (s) | restarts | dropped | robot peak RSS max (MiB) | "
        "Abs Rel (bench frames) | frames answered | latency median (ms) |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for m, entry in results["methods"].items():
        s = entry["seeds"][next(iter(entry["seeds"]))] if "seeds" in entry else entry
        rp = s["replay"]
        tests = {k: v for k, v in rp["tests"].items() if k != "bench_frames"}
        answered = sum(v.get("frames_answered", 0) for v in tests.values())
        sent = sum(v.get("frames_sent", 0) for v in tests.values())
        lat = [x for v in tests.values() for x in v.get("latency_s", [])]
        bench = (rp["tests"].get("bench_frames") or {}).get("all") or {}
        lines.append(
            f"| {m} | {rp['rounds_wall_seconds']:.1f} | {rp['robot_restarts']} | "
            f"{', '.join(rp['dropped']) or '-'} | "
            f"{rp['robot_peak_rss_bytes_max'] / 2**20:.0f} | "
            f"{bench.get('abs_rel', float('nan')):.3f} | {answered}/{sent} | "
            f"{(np.median(lat) * 1e3 if lat else float('nan')):.0f} |"
        )
    lines += ["", "![frames](replay_frames.png) ![latency](replay_latency.png)", ""]
    if r["missing"]:
        lines += ["Missing from the replay:", ""] + [f"- {x}" for x in r["missing"]] + [""]
    return "\n".join(lines)
