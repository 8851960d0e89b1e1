"""The benchmark: every method on one scenario, written as results.json + report.md + pictures.

``run_benchmark`` prepares, for every seed, the scenario (generated once and cached), the initial
checkpoint (pretrained once on the scenario's pretraining split and cached, or a user's weights
file), the fleet's descriptors, then runs each method through :class:`fedepth.sim.Simulation`
and writes:

- ``results.json``: ``methods.<name>.{abs_rel, sq_rel, rmse, rmse_log, d1, d2, d3}`` (mean over
  the last rounds, then over the seeds) with ``<metric>_std`` (sample standard deviation over
  the seeds) and every seed's numbers under ``seeds``, plus per-group numbers, per-round
  curves, bytes per round, timing, and the overlap sweep; ``config.json``: the resolved
  configuration;
- ``report.md``: tables laid out like the paper's (Table 1/2, 3a, 3b, 3c) and the figures;
- ``curves.png``, ``clusters.png`` (Jeffreys matrix and FeDepth's cluster map),
  ``predictions.png`` (RGB / ground truth / prediction per test sequence and method);
- ``state/seed<S>/``: every finished run and the checkpoint of the running one, so that the
  same benchmark on the same output continues where it stopped (see :func:`state_dir`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedepth import clustering
from fedepth.data.scenario import Scenario, load_scenario
from fedepth.depth_range import FLEET
from fedepth.descriptor import stack_descriptors
from fedepth.models import get_state, load_weights, save_weights
from fedepth.runstate import (
    RunCheckpoint,
    load_finished,
    load_tree,
    save_finished,
    save_tree,
    write_json_atomic,
    write_text_atomic,
)
from fedepth.sim import (
    TABLE_METRICS,
    Executor,
    Fleet,
    MethodRun,
    RoundRecord,
    Sample,
    SimConfig,
    Simulation,
    config_dict,
    initial_model,
    make_executor,
    prepare_fleet,
    pretrain,
)
from fedepth.strategies import create_strategy
from fedepth.transport import FleetRunner, Transport, check_transport

log = logging.getLogger(__name__)

#: Every method of the paper's tables, in table order.
ALL_METHODS = (
    "cl",
    "fedavg",
    "fedprox",
    "feddyn",
    "scaffold",
    "fedclust",
    "pacfl",
    "hard",
    "fedepth",
    "group-platform",
    "group-environment",
)
#: Table 3b's overlap ratios (1.0 is the single cluster: every client together).
SWEEP = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 1.0)


@dataclass(frozen=True)
class BenchSpec:
    """What to run: scenario, data, methods, sweep, output."""

    scenario: str
    profile: str
    methods: tuple[str, ...]
    out: Path
    sim: SimConfig
    data_dir: Path | None = None
    cache_dir: Path = Path(".cache/fedepth")
    weights: Path | None = None
    sweep: tuple[float, ...] = ()
    executor: str = "sequential"
    progress: bool = True
    #: "inprocess" (the Simulation loop) or the name of the transport handed to run_benchmark,
    #: recorded with the results: "grpc" (a real coordinator subprocess per method and one
    #: process per robot on loopback; see fedepth_coordinator.benchrun)
    transport: str = "inprocess"
    #: the seeds to run, each with its own scenario (unless ``data_dir``), pretraining (unless
    #: ``weights``) and training; empty: ``sim.seed`` alone
    seeds: tuple[int, ...] = ()
    #: start over: remove what an earlier benchmark left in ``out`` instead of resuming it
    fresh: bool = False

    @property
    def seed_list(self) -> tuple[int, ...]:
        return self.seeds or (self.sim.seed,)


#: The simulation half of each profile (every field can be overridden on the command line).
#: A profile (``--profile``: smoke, small, paper) names a size of everything: its data half,
#: the synthetic scenario's sizes, is :data:`fedepth.data.synth.scenarios.DATA_SIZES`.
#: small: sized so one method's run takes a few minutes on a 2-core CPU; paper: starting points
#: for GPU machines at the paper's scale (KITTI-like input, 50 rounds).
SIM_SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "image_size": (32, 48),
        "rounds": 3,
        "local_steps": 2,
        "last_rounds": 2,
        "pretrain_steps": 30,
        "eval_frames": 2,
        "descriptor_frames": 8,
    },
    "small": {
        "image_size": (64, 96),
        "rounds": 12,
        "local_steps": 10,
        "last_rounds": 5,
        "variance_focus": 0.5,
        "pretrain_steps": 1000,
        "pretrain_lr": 2e-3,
        "eval_frames": 8,
        "eval_every": 1,
        "descriptor_frames": 32,
    },
    "paper": {
        "image_size": (352, 704),
        "rounds": 50,
        "local_steps": 100,
        "batch_size": 8,
        "last_rounds": 5,
        "pretrain_steps": 20000,
        "eval_frames": 64,
        "descriptor_frames": 128,
    },
}


#: The methods of ``fedepth demo``: the verdict it prints is FeDepth against FedAvg.
DEMO_METHODS = ("fedavg", "fedepth")


def demo_config(seed: int = 0) -> SimConfig:
    """The embedded default job's configuration: the small profile's data, input size, loss and
    pretraining (so its cached checkpoint is shared with ``fedepth bench --profile small``),
    with a short federation: 6 rounds of 5 local steps, so that data synthesis, pretraining and
    both methods fit in 15 minutes on a 2-core CPU (docs/results.md, section 'The demo')."""
    return sim_config("hpe", "small", seed=seed, rounds=6, local_steps=5, last_rounds=3)


#: SimConfig settings added after runs were recorded, with the value that does what the code
#: did before them: at that value they leave :func:`demo_key` as it was, and a run recorded
#: without them resumes (:func:`check_out`).
ADDED_SETTINGS: dict[str, Any] = {"round_schedule": "constant", "round_final_lr_fraction": 0.1}


def _as_before(key: str, value: Any) -> bool:
    """Whether ``key`` is a setting added since runs were recorded, at its neutral value."""
    return key in ADDED_SETTINGS and ADDED_SETTINGS[key] == value


def demo_key(config: SimConfig) -> str:
    """A short hash of a demo configuration without its seed, with the versions of the data
    generator and of pretraining: what a measured seed spread (:data:`DEMO_SPREAD`) holds for."""
    from fedepth.data.synth.generate import GENERATOR_VERSION
    from fedepth.sim import PRETRAIN_REGIME

    fields = {k: v for k, v in config_dict(config).items() if k != "seed" and not _as_before(k, v)}
    text = json.dumps(
        {
            **fields,
            "methods": list(DEMO_METHODS),
            "generator": GENERATOR_VERSION,
            "pretrain_regime": PRETRAIN_REGIME,
        },
        sort_keys=True,
        default=list,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class MeasuredSpread:
    """Abs Rel of FedAvg and FeDepth over several seeds of one demo configuration: the mean
    and sample standard deviation of each, measured by ``fedepth demo --seeds ...``."""

    key: str
    seeds: tuple[int, ...]
    fedavg: tuple[float, float]
    fedepth: tuple[float, float]


#: The seed spread of :func:`demo_config`, measured on a 2-core CPU with
#: ``fedepth demo --seeds 0,1,2 --out runs/demo3`` (docs/results.md, section 'The demo'). A
#: one-seed demo prints it beside its own numbers. Its ``key`` must equal
#: ``demo_key(demo_config())``: a test fails when the configuration changes, until the spread
#: is measured again and recorded here. None: not measured for the current configuration.
DEMO_SPREAD: MeasuredSpread | None = MeasuredSpread(
    key="6a8331847b",
    seeds=(0, 1, 2),
    fedavg=(0.504, 0.067),
    fedepth=(0.481, 0.055),
)


def demo_verdict(results: dict[str, Any], reference: MeasuredSpread | None = None) -> str:
    """One line: FeDepth against FedAvg in Abs Rel, with the seed spread: this run's when it
    ran several seeds, else ``reference``, the spread measured for the demo configuration."""
    methods = results["methods"]
    fedavg, fedepth = methods["fedavg"], methods["fedepth"]
    a, b = fedavg["abs_rel"], fedepth["abs_rel"]
    change = (b - a) / a
    word = "lower" if change < 0 else "higher"
    seeds = list(results.get("seeds") or {})
    head = f"verdict: FeDepth Abs Rel {b:.3f} vs FedAvg {a:.3f}, {abs(change):.0%} {word}"

    def compare(sa: float, sb: float) -> str:
        where = "larger than" if abs(b - a) > sa + sb else "within"
        return f"the difference is {where} the combined spread ({sa + sb:.3f})"

    if len(seeds) >= 2:
        sa, sb = fedavg["abs_rel_std"], fedepth["abs_rel_std"]
        return (
            f"{head}; over seeds {', '.join(seeds)}: FeDepth {b:.3f} ± {sb:.3f}, FedAvg "
            f"{a:.3f} ± {sa:.3f} (sample std): {compare(sa, sb)}."
        )
    head += f" (seed {seeds[0] if seeds else results.get('seed', 0)})"
    if reference is None:
        return (
            f"{head}. Seed spread: not measured for this configuration; `fedepth demo --seeds "
            "0,1,2` measures it."
        )
    (ma, sa), (mb, sb) = reference.fedavg, reference.fedepth
    return (
        f"{head}. Seed spread of this configuration, measured over seeds "
        f"{', '.join(map(str, reference.seeds))} (docs/results.md, 'The demo'): FeDepth "
        f"{mb:.3f} ± {sb:.3f}, FedAvg {ma:.3f} ± {sa:.3f} (sample std): {compare(sa, sb)}."
    )


def sim_config(scenario: str, profile: str, **overrides: Any) -> SimConfig:
    """The simulation configuration of a scenario and profile, with overrides applied."""
    if profile not in SIM_SIZES:
        raise ValueError(f"unknown profile {profile!r}; choose from {', '.join(SIM_SIZES)}")
    fields = {**scenario_defaults(scenario), **SIM_SIZES[profile]}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return SimConfig(**fields)


def scenario_defaults(scenario: str) -> dict[str, Any]:
    """Depth range of the scenario's single model: HPE and BMR both reach outdoor range (80 m);
    indoor sequences are still scored with their own 10 m cap."""
    if scenario not in ("hpe", "bmr"):
        raise ValueError(f"unknown scenario {scenario!r}; choose hpe or bmr")
    return {"min_depth": FLEET.min_depth, "max_depth": FLEET.max_depth}


def ensure_data(spec: BenchSpec) -> Path:
    """The scenario directory: the given one, or generated once into the cache."""
    if spec.data_dir is not None:
        return spec.data_dir
    from fedepth.data.synth.generate import GENERATOR_VERSION, synthesize

    root = (
        spec.cache_dir
        / "data"
        / f"{spec.scenario}-{spec.profile}-s{spec.sim.seed}-g{GENERATOR_VERSION}"
    )
    if not (root / "manifest.json").is_file():
        log.info("generating the %s/%s scenario into %s", spec.scenario, spec.profile, root)
        # every core: the output does not depend on the number of worker processes
        workers = len(os.sched_getaffinity(0))
        synthesize(
            spec.scenario,
            spec.profile,
            spec.sim.seed,
            root,
            progress=spec.progress,
            workers=workers,
        )
    return root


def ensure_weights(spec: BenchSpec, scenario: Scenario) -> Path:
    """The initial checkpoint: the user's weights, or pretrained once and cached."""
    if spec.weights is not None:
        return spec.weights
    from fedepth.data.synth.generate import GENERATOR_VERSION

    c = spec.sim
    data = "" if spec.data_dir is not None else f"-g{GENERATOR_VERSION}"
    name = (
        f"{spec.scenario}-{spec.profile}{data}-{c.model}-{c.image_size[0]}x{c.image_size[1]}"
        f"-{c.pretrain_steps}steps-s{c.seed}-{c.pretrain_key()}.safetensors"
    )
    path = spec.cache_dir / "pretrain" / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        model = pretrain(scenario, c, progress=spec.progress)
        tmp = path.with_suffix(".tmp")
        save_weights(model, tmp)
        tmp.replace(path)
    return path


def _sweep_params(ratio: float) -> dict[str, Any]:
    return {"tau": float("inf")} if ratio >= 1.0 else {"overlap": ratio}


def sweep_name(ratio: float) -> str:
    return f"fedepth@{round(ratio * 100):d}%"


def run_benchmark(
    spec: BenchSpec,
    *,
    echo: Callable[[str], None] = print,
    on_round: Callable[[str, int, RoundRecord], None] | None = None,
    transport: Transport | None = None,
) -> dict[str, Any]:
    """Run the spec end to end; returns the results dict also written to results.json.

    Resumable: finished (method, seed) pairs found in ``spec.out`` are loaded instead of run,
    and an interrupted in-process method continues from its last checkpointed round (see
    :func:`state_dir`). ``spec.out`` holding a run of other settings raises
    :class:`OutConflictError` before anything runs, unless ``spec.fresh`` clears it first.
    ``on_round(name, seed, record)`` is called after every in-process round (name: a method,
    or ``sweep-<ratio>`` for a point of the overlap sweep).

    ``transport`` runs the methods when ``spec.transport`` is not ``inprocess`` (required
    then, refused otherwise: :class:`~fedepth.transport.TransportError`); pooled methods (CL)
    still run in-process. fedepth has none itself: see :mod:`fedepth.transport`.
    """
    check_transport(spec.transport, transport)
    if spec.fresh:
        clear_out(spec.out)
    check_out(spec)
    spec.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(spec.out / "config.json", run_config(spec))
    bench = _Bench(spec, echo, on_round, transport)
    try:
        for seed in bench.seeds:
            bench.run_seed(seed)
    finally:
        if bench.executor is not None:
            bench.executor.close()
    results = bench.collect()
    first = bench.fleets[bench.seeds[0]]
    write_json_atomic(
        spec.out / "config.json",
        {**run_config(spec), "data_dir": first.data_dir, "weights": first.weights},
    )
    write_json_atomic(spec.out / "results.json", results)
    write_figures(spec.out, first, bench.per_seed_methods(), bench.pictures)
    write_text_atomic(spec.out / "report.md", render_report(results))
    return results


class OutConflictError(ValueError):
    """The output directory holds a run of other settings (or one that cannot be read)."""


#: What ``fedepth bench`` writes into its ``--out`` (what ``--fresh`` removes).
OUTPUTS = (
    "state",
    "grpc",
    "results.json",
    "config.json",
    "report.md",
    "curves.png",
    "clusters.png",
    "predictions.png",
)


def clear_out(out: Path) -> None:
    """Remove what an earlier benchmark wrote into ``out`` (other files stay)."""
    for name in OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def state_dir(out: Path, seed: int) -> Path:
    """Where one seed's runs are kept: ``<key>/summary.json`` + ``samples.safetensors`` once a
    run finished, ``<key>/checkpoint/`` while it runs (key: the method name, or
    ``sweep-<ratio>`` for a point of the overlap sweep), ``fleet.json`` + ``fleet.safetensors``
    for the report (clients, test sequences, descriptors)."""
    return out / "state" / f"seed{seed}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_config(spec: BenchSpec) -> dict[str, Any]:
    """The resolved configuration saved as config.json (``sim.seed``: the first seed)."""
    return {
        "sim": config_dict(replace(spec.sim, seed=spec.seed_list[0])),
        "scenario": spec.scenario,
        "profile": spec.profile,
        "methods": list(spec.methods),
        "sweep": list(spec.sweep),
        "seeds": list(spec.seed_list),
        "executor": spec.executor,
        "transport": spec.transport,
        "inputs": {
            "data": None if spec.data_dir is None else str(spec.data_dir.resolve()),
            "weights": None if spec.weights is None else str(spec.weights.resolve()),
            "weights_sha256": None if spec.weights is None else _sha256(spec.weights),
        },
    }


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a saved configuration that must match to resume it: everything that
    changes a run's numbers (not: methods, sweep points and seeds, which may grow, nor the
    executor, whose results are identical)."""
    out = {("backbone" if k == "model" else k): v for k, v in config["sim"].items()}
    out.pop("seed", None)
    out.update({k: config.get(k) for k in ("scenario", "profile", "transport")})
    out.update(config.get("inputs", {}))
    return out


def _show(key: str, value: Any) -> str:
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def check_out(spec: BenchSpec) -> None:
    """Raise :class:`OutConflictError` when ``spec.out`` holds a run whose settings differ."""
    path = spec.out / "config.json"
    if not path.is_file():
        if (spec.out / "state").exists():
            raise OutConflictError(
                f"{spec.out} holds runs in state/ but no config.json to check them against; "
                "use another --out, or --fresh to start over"
            )
        return
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        saved = _settings(config)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OutConflictError(
            f"{spec.out} holds a config.json that cannot be read ({exc}); "
            "use another --out, or --fresh to start over"
        ) from exc
    current = json.loads(json.dumps(run_config(spec)))  # as it would read back from disk
    wanted = _settings(current)
    if "inputs" not in config:  # written before runs could resume: no inputs recorded
        wanted = {k: v for k, v in wanted.items() if k not in current["inputs"]}
    # a setting added since that run was written, at the value that does what the code did
    # before it, is what the run did: the same run
    wanted = {k: v for k, v in wanted.items() if k in saved or not _as_before(k, v)}
    unset = object()
    keys = [
        k for k in dict.fromkeys([*wanted, *saved]) if saved.get(k, unset) != wanted.get(k, unset)
    ]
    if keys:
        then = ", ".join(_show(k, saved.get(k, "(unset)")) for k in keys)
        now = ", ".join(_show(k, wanted.get(k, "(unset)")) for k in keys)
        raise OutConflictError(
            f"{spec.out} holds a run with {then}; this command has {now}; "
            "use another --out, or --fresh to start over"
        )


@dataclass
class FleetSummary:
    """What the report and the figures need of one seed's prepared fleet (kept on disk, so a
    run whose pairs all finished earlier needs neither data nor descriptors)."""

    data_dir: str
    weights: str
    clients: list[dict[str, str]]  # name, platform, environment
    test: list[str]  # test sequence names
    means: np.ndarray  # client descriptors (N, D)
    variances: np.ndarray

    @classmethod
    def of(cls, fleet: Fleet, data_dir: Path, weights: Path) -> FleetSummary:
        means, variances = stack_descriptors([i.descriptor for i in fleet.infos if i.descriptor])
        return cls(
            data_dir=str(data_dir),
            weights=str(weights),
            clients=[
                {
                    "name": i.cid,
                    "platform": i.labels.get("platform", ""),
                    "environment": i.labels.get("environment", ""),
                }
                for i in fleet.infos
            ],
            test=[s.name for s, _, _ in fleet.test_queries],
            means=means,
            variances=variances,
        )

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        save_tree(directory / "fleet.safetensors", {"means": self.means, "var": self.variances})
        write_json_atomic(
            directory / "fleet.json",
            {
                "data_dir": self.data_dir,
                "weights": self.weights,
                "clients": self.clients,
                "test": self.test,
            },
        )

    @classmethod
    def load(cls, directory: Path) -> FleetSummary | None:
        if not (directory / "fleet.json").is_file():
            return None
        head = json.loads((directory / "fleet.json").read_text(encoding="utf-8"))
        arrays = load_tree(directory / "fleet.safetensors")
        return cls(
            data_dir=head["data_dir"],
            weights=head["weights"],
            clients=head["clients"],
            test=head["test"],
            means=arrays["means"],
            variances=arrays["var"],
        )


def _sweep_key(ratio: float) -> str:
    return f"sweep-{ratio:g}"


class _Bench:
    """One ``run_benchmark``: the runs of every seed, finished ones loaded from disk."""

    def __init__(
        self,
        spec: BenchSpec,
        echo: Callable[[str], None],
        on_round: Callable[[str, int, RoundRecord], None] | None,
        transport: Transport | None = None,
    ) -> None:
        self.spec, self.echo, self.on_round = spec, echo, on_round
        self.transport = transport
        self.t_start = time.perf_counter()
        self.seeds = spec.seed_list
        #: run keys in table order: the methods, then the sweep points (one per distinct key)
        self.keys = list(dict.fromkeys([*spec.methods, *map(_sweep_key, spec.sweep)]))
        self.done: dict[str, dict[int, dict[str, Any]]] = {k: {} for k in self.keys}
        self.pictures: dict[str, dict[str, list[Sample]]] = {}  # the first seed's, by key
        self.fleets: dict[int, FleetSummary] = {}
        self.executor: Executor | None = None

    def label(self, key: str) -> str:
        if key.startswith("sweep-"):
            return sweep_name(float(key.removeprefix("sweep-")))
        return key

    # -- running -----------------------------------------------------------------------------
    def run_seed(self, seed: int) -> None:
        sdir = state_dir(self.spec.out, seed)
        todo = []
        for key in self.keys:
            got = load_finished(sdir / key)
            if got is None:
                todo.append(key)
                continue
            self.echo(f"{self.label(key)}: seed {seed} finished earlier ({sdir / key})")
            self.keep(key, seed, got[0], got[1])
            RunCheckpoint(sdir / key / "checkpoint").clear()  # left if killed right after
        fleet = FleetSummary.load(sdir)
        if fleet is not None and not todo:
            self.fleets[seed] = fleet
            return
        self.train_seed(seed, todo)

    def train_seed(self, seed: int, todo: list[str]) -> None:
        spec = replace(self.spec, sim=replace(self.spec.sim, seed=seed), seeds=(seed,))
        sdir = state_dir(spec.out, seed)
        root = ensure_data(spec)
        scenario = load_scenario(root)
        remote: FleetRunner | None = None
        try:
            weights = ensure_weights(spec, scenario)
            model = initial_model(spec.sim, str(weights))
            fleet = prepare_fleet(scenario, model, spec.sim, progress=spec.progress)
            self.fleets[seed] = FleetSummary.of(fleet, root, weights)
            self.fleets[seed].save(sdir)
            if not todo:
                return
            initial = get_state(model)
            if self.executor is None:
                self.executor = make_executor(spec.executor)
            executor = self.executor
            sim = Simulation(fleet, initial, spec.sim, executor)
            workdir = (
                spec.out / "grpc" if len(self.seeds) == 1 else spec.out / "grpc" / f"seed{seed}"
            )
            if self.transport is not None:
                remote = self.transport(fleet, initial, spec.sim, workdir, progress=spec.progress)
            methods = [m for m in spec.methods if m in todo]
            ratios = list({_sweep_key(r): r for r in spec.sweep if _sweep_key(r) in todo}.values())
            # the runs through the coordinator, in order (method, strategy params; None: the
            # config's)
            plan: list[tuple[str, dict[str, Any] | None]] = []
            if remote is not None:
                plan = [(m, None) for m in methods if not is_pooled(m, spec.sim)]
                plan += [("fedepth", _sweep_params(r)) for r in ratios]
                remote.start(plan[0] if plan else None)  # robots start while in-process runs go

            def run_remote(method: str, params: dict[str, Any] | None) -> MethodRun:
                assert remote is not None
                plan.pop(0)
                return remote.run(method, params, then=plan[0] if plan else None)

            def run_local(key: str, runner: Simulation, method: str) -> MethodRun:
                ck = RunCheckpoint(sdir / key / "checkpoint")
                n = ck.rounds_done()
                if n:
                    self.echo(
                        f"{self.label(key)}: seed {seed} resumes after round {n} of "
                        f"{spec.sim.rounds} ({ck.directory})"
                    )
                hook = self.on_round
                return runner.run(
                    method,
                    progress=spec.progress,
                    checkpoint=ck,
                    on_round=None if hook is None else lambda rec: hook(key, seed, rec),
                )

            for method in methods:
                if remote is not None and is_pooled(method, spec.sim):
                    self.echo(
                        f"{method}: one pooled participant, not a fleet of robots: run in-process"
                    )
                    run = run_local(method, sim, method)
                elif remote is not None:
                    run = run_remote(method, None)
                else:
                    run = run_local(method, sim, method)
                self.finish(method, seed, run)
            for ratio in ratios:
                key = _sweep_key(ratio)
                if remote is not None:
                    run = run_remote("fedepth", _sweep_params(ratio))
                else:
                    params = dict(spec.sim.method_params)
                    params["fedepth"] = _sweep_params(ratio)
                    sweep_sim = Simulation(
                        fleet, initial, replace(spec.sim, method_params=params), executor
                    )
                    run = run_local(key, sweep_sim, "fedepth")
                self.finish(key, seed, run)
        finally:
            if remote is not None:
                remote.close()
            scenario.close()

    def keep(
        self, key: str, seed: int, summary: dict[str, Any], samples: dict[str, list[Sample]]
    ) -> None:
        self.done[key][seed] = summary
        if seed == self.seeds[0]:
            self.pictures[key] = samples

    def finish(self, key: str, seed: int, run: MethodRun) -> None:
        """Keep a finished run on disk (its checkpoint goes), echo it, update results.json."""
        pair = state_dir(self.spec.out, seed) / key
        summary = save_finished(pair, _summary(run), run.samples)
        RunCheckpoint(pair / "checkpoint").clear()
        self.keep(key, seed, summary, run.samples)
        self.echo(_one_line(self.label(key), summary, seed if len(self.seeds) > 1 else None))
        # results so far, so a long run can be watched
        write_json_atomic(self.spec.out / "results.json", self.collect())

    # -- results -----------------------------------------------------------------------------
    def combined(self, key: str) -> dict[str, Any]:
        return combine_seeds(
            {str(s): self.done[key][s] for s in self.seeds if s in self.done[key]}
        )

    def per_seed_methods(self) -> dict[str, list[dict[str, Any]]]:
        """Every method's per-seed summaries in seed order (the sweep left out)."""
        return {
            m: [self.done[m][s] for s in self.seeds if s in self.done[m]]
            for m in self.spec.methods
            if self.done[m]
        }

    def collect(self) -> dict[str, Any]:
        spec = self.spec
        first = self.fleets[next(s for s in self.seeds if s in self.fleets)]
        return {
            "scenario": spec.scenario,
            "profile": spec.profile,
            "seed": self.seeds[0],
            "seeds": {
                str(s): {"data_dir": self.fleets[s].data_dir, "weights": self.fleets[s].weights}
                for s in self.seeds
                if s in self.fleets
            },
            "backbone": spec.sim.model,
            "data_dir": first.data_dir,
            "weights": first.weights,
            "num_clients": len(first.clients),
            "num_test_sequences": len(first.test),
            "transport": spec.transport,
            "methods": {m: self.combined(m) for m in spec.methods if self.done[m]},
            "overlap_sweep": {
                f"{r:g}": self.combined(_sweep_key(r))
                for r in spec.sweep
                if self.done[_sweep_key(r)]
            },
            "wall_seconds": time.perf_counter() - self.t_start,
        }


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values))


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof = 1) over seeds; 0 for a single seed."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _combine_metrics(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean of every metric under its name, then its spread under ``<name>_std``."""
    if not rows:
        return {}
    names = list(rows[0])
    out = {k: _mean([r[k] for r in rows]) for k in names}
    out.update({f"{k}_std": _std([r[k] for r in rows]) for k in names})
    return out


def _combine_curves(curves: Sequence[Mapping[str, list[Any]]]) -> dict[str, list[Any]]:
    def mean_or_none(values: list[Any]) -> float | None:
        return None if any(v is None for v in values) else _mean(values)

    first = curves[0]
    return {
        **first,
        "train_loss": [
            _mean(list(v)) for v in zip(*(c["train_loss"] for c in curves), strict=True)
        ],
        "abs_rel": [
            mean_or_none(list(v)) for v in zip(*(c["abs_rel"] for c in curves), strict=True)
        ],
    }


def combine_seeds(per_seed: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One run's entry in results.json from its per-seed summaries (keyed by seed, in order).

    The layout of a single summary: the table metrics are means over the seeds, followed by
    their sample standard deviations ``<metric>_std`` (0 for one seed); ``final_all`` and every
    entry of ``groups`` and ``per_sequence`` likewise (a group or sequence: over the seeds that
    have it); ``curves``, ``timing`` and the byte means are means over the seeds; what has no
    mean (clusters, params, routes, per-round bytes, transport details) is the first seed's.
    ``seeds`` holds every seed's full summary.
    """
    runs = list(per_seed.values())
    first = runs[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key in TABLE_METRICS:
            out[key] = _mean([r[key] for r in runs])
        elif key == "final_all":
            out[key] = _combine_metrics([r[key] for r in runs])
        elif key in ("groups", "per_sequence"):
            names = dict.fromkeys(g for r in runs for g in r[key])
            out[key] = {
                g: _combine_metrics([r[key][g] for r in runs if g in r[key]]) for g in names
            }
        elif key == "curves":
            out[key] = _combine_curves([r[key] for r in runs])
        elif key == "timing":
            out[key] = {k: _mean([r[key][k] for r in runs]) for k in value}
        elif key == "bytes_per_round":
            out[key] = {
                **value,
                **{k: _mean([r[key][k] for r in runs]) for k in ("download_mean", "upload_mean")},
            }
        else:
            out[key] = value
    stds = {f"{k}_std": _std([r[k] for r in runs]) for k in TABLE_METRICS if k in first}
    last = next((k for k in reversed(list(out)) if k in TABLE_METRICS), None)
    ordered: dict[str, Any] = {}
    for key, value in out.items():
        ordered[key] = value
        if key == last:
            ordered.update(stds)
    ordered["seeds"] = {s: dict(r) for s, r in per_seed.items()}
    return ordered


def beyond_spread(a: Mapping[str, Any], b: Mapping[str, Any], metric: str) -> bool:
    """Whether two runs differ in ``metric`` by more than their combined spread over seeds:
    ``|mean_a - mean_b| > std_a + std_b``."""
    spread = a.get(f"{metric}_std", 0.0) + b.get(f"{metric}_std", 0.0)
    return bool(abs(a[metric] - b[metric]) > spread)


def is_pooled(method: str, config: SimConfig) -> bool:
    """Whether a method trains one pooled participant (CL) instead of the fleet's clients."""
    strategy = create_strategy(method, **dict(config.method_params.get(method, {})))
    return bool(getattr(strategy, "pooled", False))


def _summary(run: MethodRun) -> dict[str, Any]:
    out = run.summary()
    out.setdefault("transport", "inprocess")
    return out


def _one_line(name: str, summary: Mapping[str, Any], seed: int | None = None) -> str:
    at = "" if seed is None else f"seed {seed}  "
    return (
        f"{name:<18} {at}abs_rel {summary['abs_rel']:.3f}  rmse {summary['rmse']:.3f}"
        f"  d1 {summary['d1']:.3f}  clusters {len(summary['clusters']) or 1}"
    )


# -- report -------------------------------------------------------------------------------------
#: The mark of a difference from FeDepth beyond the combined spread over seeds.
MARK = "*"


def _cell(vals: Mapping[str, Any], col: str, spread: bool) -> str:
    """``mean`` (one seed) or ``mean ± std`` (several), ``-`` when missing."""
    v = vals.get(col)
    if not isinstance(v, (int, float)):
        return "-"
    std = vals.get(f"{col}_std")
    return f"{v:.3f} ± {std:.3f}" if spread and isinstance(std, (int, float)) else f"{v:.3f}"


def _table(
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    cols: Sequence[str],
    header: Sequence[str] | None = None,
    *,
    spread: bool = False,
    ref: Mapping[str, Any] | None = None,
) -> str:
    """A markdown table; with ``spread``, cells are mean ± std and every cell of a row other
    than ``ref`` (FeDepth's) that differs from it beyond the combined spread is marked."""
    head = header or cols
    lines = [
        "| Method | " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head) + " |",
    ]
    for name, vals in rows:
        cells = []
        for c in cols:
            cell = _cell(vals, c, spread)
            marked = (
                spread
                and ref is not None
                and vals is not ref
                and isinstance(vals.get(c), (int, float))
                and isinstance(ref.get(c), (int, float))
                and beyond_spread(vals, ref, c)
            )
            cells.append(f"{cell} {MARK}" if marked else cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_report(results: dict[str, Any]) -> str:
    """Markdown report with the paper's table layout (mean ± std when several seeds ran)."""
    m = results["methods"]
    seeds = list(results.get("seeds") or [results["seed"]])
    spread = len(seeds) > 1
    ref = m.get("fedepth")
    arrows = [
        "Abs Rel ↓",
        "Sq Rel ↓",
        "RMSE ↓",
        "RMSE log ↓",
        "δ<1.25 ↑",
        "δ<1.25² ↑",
        "δ<1.25³ ↑",
    ]
    table_no = "1" if results["scenario"] == "hpe" else "2"
    out = [
        f"# fedepth benchmark: {results['scenario'].upper()} ({results['profile']} profile)",
        "",
        f"Backbone `{results['backbone']}`, "
        + (f"seeds {', '.join(map(str, seeds))}, " if spread else f"seed {results['seed']}, ")
        + f"{results['num_clients']} clients, {results['num_test_sequences']} unseen test "
        f"sequences; numbers are means over the last rounds (see config.json). "
        f"Wall time {results['wall_seconds'] / 60:.1f} min (this command; runs that an "
        "earlier one finished are loaded from state/, not rerun). "
        + (
            f"Every number is the mean ± the sample standard deviation (ddof = 1) over the "
            f"{len(seeds)} seeds; each seed generates its own scenario (unless `--data` is "
            "given), pretrains its own initial model (unless `--weights`) and trains every "
            "method with its own seed. "
            + (
                f"{MARK} marks a difference from FeDepth larger than the combined spread, "
                "|mean_FeDepth - mean_method| > std_FeDepth + std_method; unmarked differences "
                "lie within the spread."
                if ref is not None
                else "FeDepth did not run, so no difference is marked."
            )
            if spread
            else "One seed: no spread is measured and no difference is marked "
            "(`--seeds 0,1,2` gives mean ± std)."
        ),
        "",
    ]
    if results.get("transport") == "grpc":
        local = [k for k, v in m.items() if v.get("transport") != "grpc"]
        out += [
            "Transport: **gRPC**. Each method ran through a real `fedepth-coordinator` process "
            "with one robot process per client on loopback; for the same seed the numbers are "
            "those of the in-process run, and time now includes the wire "
            "(see docs/coordinator.md)."
            + (f" Run in-process (not a fleet): {', '.join(local)}." if local else ""),
            "",
        ]
    out += [
        f"## Table {table_no}: methods",
        "",
        _table([(k, v) for k, v in m.items()], TABLE_METRICS, arrows, spread=spread, ref=ref),
        "",
    ]
    out += [
        "## Convergence: Abs Rel over the last five evaluated rounds",
        "",
        "| Method | first | last | relative change |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {k} | {c[0]:.3f} | {c[1]:.3f} | {c[2]:+.1%} |"
            for k, c in ((k, curve_change(v["curves"]["abs_rel"])) for k, v in m.items())
            if c is not None
        ),
        "",
        "A curve has flattened where the relative change is small against the differences "
        "between methods" + (" (curves averaged over the seeds)." if spread else "."),
        "",
    ]
    if "hard" in m and "fedepth" in m:
        out += [
            "## Table 3a: hard vs soft clustering at the same tau",
            "",
            _table(
                [("Hard clustering", m["hard"]), ("Soft clustering (FeDepth)", m["fedepth"])],
                ["abs_rel"],
                ["Abs Rel ↓"],
                spread=spread,
                ref=m["fedepth"],
            ),
            "",
        ]
    sweep = results.get("overlap_sweep") or {}
    if sweep:
        ratios = list(sweep)
        out += [
            "## Table 3b: overlap ratio sweep (FeDepth)",
            "",
            "| Overlap target | " + " | ".join(f"{float(r):.0%}" for r in ratios) + " |",
            "| --- | " + " | ".join("---:" for _ in ratios) + " |",
            "| Abs Rel ↓ | "
            + " | ".join(_cell(sweep[r], "abs_rel", spread) for r in ratios)
            + " |",
            "| clusters K | " + " | ".join(_clusters_k(sweep[r]) for r in ratios) + " |",
            "",
            "100 % means one cluster holding every client (tau = infinity); a "
            "target is met by the smallest tau whose merged map comes closest to it."
            + (" K per seed where the seeds differ." if spread else ""),
            "",
        ]
    group_names = sorted({g for v in m.values() for g in v["groups"]})
    if group_names:
        cols = [*group_names, "all"]
        rows = [(k, _group_row(v)) for k, v in m.items()]
        out += [
            "## Table 3c: Abs Rel per platform and environment of the test sequences",
            "",
            _table(
                rows,
                cols,
                [g.split(":", 1)[1] for g in group_names] + ["All"],
                spread=spread,
                ref=dict(rows)["fedepth"] if ref is not None else None,
            ),
            "",
        ]
    out += [
        "## Communication and time",
        "",
        "| Method | download / client / round | upload / client / round | train s | "
        "descriptors s | clustering s | aggregation s | wire s | per-round overhead | "
        "overhead |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, v in m.items():
        b, t = v["bytes_per_round"], v["timing"]
        out.append(
            f"| {k} | {b['download_mean'] / 2**20:.2f} MiB | "
            f"{b['upload_mean'] / 2**20:.2f} MiB | {t['train_seconds']:.1f} | "
            f"{t['descriptor_seconds']:.1f} | {t['setup_seconds']:.2f} | "
            f"{t['aggregate_seconds']:.2f} | {t['wire_seconds']:.2f} | "
            f"{t['round_overhead_fraction']:.1%} | {t['overhead_fraction']:.1%} |"
        )
    out += [
        "",
        "Overhead = descriptors of the fleet (computed once, before round 1) + clustering "
        "(strategy set-up) + per round the strategy's aggregation and the wire format (each "
        "distinct model encoded once, every upload encoded, decoded and checked for finite "
        "values, as the coordinator does). *Per-round overhead* leaves out the one-time "
        "descriptors and clustering; *overhead* includes them. Clients train one after another "
        "here, so both fractions compare the server's work with the fleet's summed training time."
        + (" Times and bytes are means over the seeds." if spread else ""),
        "",
        "## Figures",
        "",
        *(
            [
                f"Curves: the mean over the {len(seeds)} seeds, shaded ± one sample standard "
                f"deviation; the cluster map and the predictions are those of seed {seeds[0]}.",
                "",
            ]
            if spread
            else []
        ),
        "![convergence](curves.png)",
        "",
        "![Jeffreys matrix and cluster map](clusters.png)",
        "",
        "![predictions](predictions.png)",
        "",
    ]
    return "\n".join(out)


def curve_change(
    curve: Sequence[float | None], rounds: int = 5
) -> tuple[float, float, float] | None:
    """First and last value of the last ``rounds`` evaluated points of a curve, and the
    relative change between them (None when fewer than two points were evaluated)."""
    points = [float(v) for v in curve if v is not None][-rounds:]
    if len(points) < 2:
        return None
    return points[0], points[-1], (points[-1] - points[0]) / points[0]


def _clusters_k(entry: Mapping[str, Any]) -> str:
    """Table 3b's K: one number, or one per seed where the seeds differ."""
    ks = [len(s["clusters"]) or 1 for s in (entry.get("seeds") or {"": entry}).values()]
    return str(ks[0]) if len(set(ks)) == 1 else " / ".join(map(str, ks))


def _group_row(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Table 3c's cells of one method: Abs Rel (and its spread) per group and overall."""
    row: dict[str, Any] = {}
    for g, vals in entry["groups"].items():
        row[g] = vals["abs_rel"]
        if "abs_rel_std" in vals:
            row[f"{g}_std"] = vals["abs_rel_std"]
    row["all"] = entry["abs_rel"]
    if "abs_rel_std" in entry:
        row["all_std"] = entry["abs_rel_std"]
    return row


def write_figures(
    out: Path,
    fleet: FleetSummary,
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    pictures: Mapping[str, Mapping[str, list[Sample]]],
) -> None:
    """curves.png, clusters.png and predictions.png.

    ``runs``: every method's per-seed summaries (first seed first); the curves show their
    mean, shaded ± one sample standard deviation when there are several. ``fleet`` and
    ``pictures`` (per method, the pictures of the last evaluation) are the first seed's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, per_seed in runs.items():
        curves = [s["curves"] for s in per_seed]
        rounds = np.asarray(curves[0]["round"]) + 1
        loss = np.asarray([c["train_loss"] for c in curves], dtype=float)
        (line,) = axes[0].plot(rounds, loss.mean(axis=0), label=name)
        if len(curves) > 1:
            band = loss.std(axis=0, ddof=1)
            axes[0].fill_between(
                rounds,
                loss.mean(axis=0) - band,
                loss.mean(axis=0) + band,
                color=line.get_color(),
                alpha=0.2,
            )
        at = [i for i in range(len(rounds)) if all(c["abs_rel"][i] is not None for c in curves)]
        if at:
            err = np.asarray([[c["abs_rel"][i] for i in at] for c in curves], dtype=float)
            (line,) = axes[1].plot(rounds[at], err.mean(axis=0), marker="o", label=name)
            if len(curves) > 1:
                band = err.std(axis=0, ddof=1)
                axes[1].fill_between(
                    rounds[at],
                    err.mean(axis=0) - band,
                    err.mean(axis=0) + band,
                    color=line.get_color(),
                    alpha=0.2,
                )
    axes[0].set(title="mean local training loss", xlabel="round")
    axes[1].set(title="test Abs Rel (routed models)", xlabel="round")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)

    A = clustering.jeffreys_matrix(fleet.means, fleet.variances)
    fed = runs.get("fedepth")
    tau = fed[0]["params"].get("tau") if fed else None
    if tau is None:
        tau = clustering.calibrate_tau(A, 0.2)
    m_star = clustering.soft_clustering(A, float(tau)).M_star
    names = [f"{c['platform'][:4]}/{c['environment'][:7]}" for c in fleet.clients]
    fig, axes = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [1, 1.3]})
    im = axes[0].imshow(A, cmap="viridis")
    axes[0].set_title("Jeffreys divergence between clients")
    axes[0].set_yticks(range(len(names)), names, fontsize=5)
    fig.colorbar(im, ax=axes[0], fraction=0.046)
    axes[1].imshow(m_star, cmap="Greys", aspect="auto", interpolation="nearest")
    axes[1].set_title(f"FeDepth cluster map M* (tau={float(tau):.3g}, K={m_star.shape[0]})")
    axes[1].set_xticks(range(len(names)), names, rotation=90, fontsize=5)
    axes[1].set_ylabel("cluster")
    fig.tight_layout()
    fig.savefig(out / "clusters.png", dpi=110)
    plt.close(fig)

    shown = [name for name in runs if name in pictures][:4]
    seqs = fleet.test[:6]
    if not shown or not seqs:
        return
    cols = 2 + len(shown)
    fig, axes = plt.subplots(len(seqs), cols, figsize=(2.2 * cols, 1.8 * len(seqs)), squeeze=False)
    for r, seq in enumerate(seqs):
        first = pictures[shown[0]].get(seq)
        if not first:
            continue
        rgb, gt, _ = first[0]
        vmax = float(np.percentile(gt[gt > 0], 95)) if (gt > 0).any() else 1.0
        axes[r, 0].imshow(rgb)
        axes[r, 1].imshow(np.where(gt > 0, gt, np.nan), cmap="magma_r", vmin=0, vmax=vmax)
        for c, name in enumerate(shown):
            sample = pictures[name].get(seq)
            if sample:
                axes[r, 2 + c].imshow(sample[0][2], cmap="magma_r", vmin=0, vmax=vmax)
        axes[r, 0].set_ylabel(seq[:18], fontsize=6)
    for c, title in enumerate(["RGB", "ground truth", *shown]):
        axes[0, c].set_title(title, fontsize=8)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(out / "predictions.png", dpi=110)
    plt.close(fig)


def check_weights(config: SimConfig, weights: Path) -> None:
    """Load a user's weights file into the configured model before a long run (fails fast)."""
    load_weights(config.build_model(), weights)


def format_table(results: dict[str, Any]) -> str:
    """The methods table as fixed-width text for the terminal."""
    rows = [f"{'method':<20}" + "".join(f"{k:>10}" for k in TABLE_METRICS)]
    entries = list(results["methods"].items())
    entries += [(sweep_name(float(r)), v) for r, v in results.get("overlap_sweep", {}).items()]
    for name, v in entries:
        rows.append(f"{name:<20}" + "".join(f"{v[k]:>10.3f}" for k in TABLE_METRICS))
    seeds = results.get("seeds") or {}
    if len(seeds) > 1:
        rows.append(f"(means over seeds {', '.join(seeds)}; report.md gives mean ± std)")
    return "\n".join(rows)
