"""Running a benchmark: :func:`run_benchmark`, every seed's methods and sweep points.

Finished (run, seed) pairs are loaded from the output's state, an interrupted in-process run
resumes from its checkpoint; results.json is rewritten after every finished run, then the
figures and the report are written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedepth.bench.choice import validation_choice
from fedepth.bench.combine import combine_seeds
from fedepth.bench.composition import with_composition
from fedepth.bench.figures import write_figures
from fedepth.bench.fleet_summary import (
    FleetSummary,
    describe_machine,
    file_sha256,
    machine,
    weights_sha256,
)
from fedepth.bench.inputs import ensure_data, ensure_weights
from fedepth.bench.outdir import OutConflictError, check_out, clear_out, run_config, state_dir
from fedepth.bench.report import render_report
from fedepth.bench.spec import BenchSpec, rule_point, rule_sweep_name, sweep_name
from fedepth.data.holdout import holdout_validation
from fedepth.data.scenario import load_scenario
from fedepth.models import get_state
from fedepth.models.base import FeatureExtractor
from fedepth.runstate import (
    RunCheckpoint,
    load_finished,
    save_finished,
    write_json_atomic,
    write_text_atomic,
)
from fedepth.sim import (
    Executor,
    MethodRun,
    RoundRecord,
    Sample,
    SimConfig,
    Simulation,
    initial_model,
    make_executor,
    prepare_fleet,
)
from fedepth.strategies import create_strategy, forms_clusters
from fedepth.transport import FleetRunner, Transport, check_transport


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
    or ``sweep-<ratio>`` for a point of the overlap sweep, ``sweep-<rule>=<name>`` for one of
    FeDepth's rule sweep). With a validation split (``spec.sim.validation_share``), the sweep
    point of lowest validation Abs Rel is results.json's ``chosen``
    (:func:`~fedepth.bench.choice.validation_choice`).

    ``transport`` runs the methods when ``spec.transport`` is not ``inprocess`` (required
    then, refused otherwise: :class:`~fedepth.transport.TransportError`); pooled methods (CL)
    still run in-process. fedepth has none itself: see :mod:`fedepth.transport`.
    """
    check_transport(spec.transport, transport)
    if spec.sim.validation_share > 0 and spec.transport != "inprocess":
        raise ValueError(
            f"a validation split needs the in-process transport: the robots of {spec.transport} "
            "train on all of their frames"
        )
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


def _sweep_params(ratio: float) -> dict[str, Any]:
    return {"tau": float("inf")} if ratio >= 1.0 else {"overlap": ratio}


def _sweep_key(ratio: float) -> str:
    return f"sweep-{ratio:g}"


def _rule_key(point: tuple[str, str]) -> str:
    return f"sweep-{rule_point(point)}"


def _split_point(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    return (key, value)


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
        #: the sweep points (one per distinct key): key -> FeDepth's parameters; the overlap
        #: sweep's replace FeDepth's configured ones, a rule sweep's replace one of them
        self.points: dict[str, dict[str, Any]] = {}
        for ratio in spec.sweep:
            self.points.setdefault(_sweep_key(ratio), _sweep_params(ratio))
        for point in spec.rule_sweep:
            own = dict(spec.sim.method_params.get("fedepth", {}))
            self.points.setdefault(_rule_key(point), {**own, point[0]: point[1]})
        #: run keys in table order: the methods, then the sweep points
        self.keys = list(dict.fromkeys([*spec.methods, *self.points]))
        self.done: dict[str, dict[int, dict[str, Any]]] = {k: {} for k in self.keys}
        self.pictures: dict[str, dict[str, list[Sample]]] = {}  # the first seed's, by key
        self.fleets: dict[int, FleetSummary] = {}
        self.executor: Executor | None = None

    def label(self, key: str) -> str:
        if key.startswith("sweep-"):
            point = key.removeprefix("sweep-")
            if "=" in point:
                return rule_sweep_name(_split_point(point))
            return sweep_name(float(point))
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
        root = ensure_data(spec, self.echo)
        scenario = load_scenario(root)
        remote: FleetRunner | None = None
        try:
            if spec.sim.validation_share > 0:  # a share no client can give: before pretraining
                holdout_validation(scenario.clients, spec.sim.validation_share)
            weights = ensure_weights(spec, scenario, self.echo)
            digest = weights_sha256(weights)
            self.check_same_start(seed, weights, digest)
            model = initial_model(spec.sim, str(weights))
            describer = (
                FeatureExtractor.imagenet(model.encoder.name)
                if spec.sim.descriptor_encoder == "imagenet"
                else model
            )
            fleet = prepare_fleet(scenario, describer, spec.sim, progress=spec.progress)
            self.fleets[seed] = FleetSummary.of(fleet, root, weights, digest)
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
            points = [k for k in self.points if k in todo]
            # the runs through the coordinator, in order (method, strategy params; None: the
            # config's)
            plan: list[tuple[str, dict[str, Any] | None]] = []
            if remote is not None:
                plan = [(m, None) for m in methods if not is_pooled(m, spec.sim)]
                plan += [("fedepth", self.points[k]) for k in points]
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
            for key in points:
                if remote is not None:
                    run = run_remote("fedepth", self.points[key])
                else:
                    params = dict(spec.sim.method_params)
                    params["fedepth"] = self.points[key]
                    sweep_sim = Simulation(
                        fleet, initial, replace(spec.sim, method_params=params), executor
                    )
                    run = run_local(key, sweep_sim, "fedepth")
                self.finish(key, seed, run)
        finally:
            if remote is not None:
                remote.close()
            scenario.close()

    def check_same_start(self, seed: int, weights: Path, digest: str) -> None:
        """Refuse to add runs to a seed whose finished or interrupted runs started from another
        checkpoint (pretrained again on a CPU whose kernels round differently, or a replaced
        cache file): the seed's table would mix two starting points."""
        sdir = state_dir(self.spec.out, seed)
        finished = sorted(
            self.label(run.name)
            for run in sdir.glob("*/")
            if (run / "summary.json").is_file() or RunCheckpoint(run / "checkpoint").rounds_done()
        )
        earlier = FleetSummary.load(sdir)
        if not finished or earlier is None or earlier.weights_sha256 in (None, digest):
            return
        if earlier.weights_sha256 == file_sha256(weights):
            return  # recorded before the digest was of the content: the file's bytes
        where = describe_machine(earlier.machine)
        raise OutConflictError(
            f"{self.spec.out}: seed {seed}'s runs ({', '.join(finished)}) started "
            f"from a checkpoint with SHA-256 {earlier.weights_sha256[:12]}"
            + (f", pretrained on {where}" if where else "")
            + f"; {weights} has {digest[:12]}"
            + (f" here, on {describe_machine(machine())}" if where else "")
            + " (the same settings pretrain another checkpoint on a CPU whose kernels round "
            "differently); use another --out, or --fresh to start over"
        )

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
            {str(s): self.described(key, s) for s in self.seeds if s in self.done[key]}
        )

    def described(self, key: str, seed: int) -> dict[str, Any]:
        """A finished run's summary, with its cluster composition where its method forms
        clusters (derived from its clusters, routes and the seed's fleet, so runs recorded
        before the composition existed have it too)."""
        summary = self.done[key][seed]
        fleet = self.fleets.get(seed)
        method = "fedepth" if key.startswith("sweep-") else key
        if fleet is None or not forms_clusters(method):
            return dict(summary)
        return with_composition(summary, fleet)

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
        results: dict[str, Any] = {
            "scenario": spec.scenario,
            "profile": spec.profile,
            "seed": self.seeds[0],
            "seeds": {str(s): self.fleets[s].provenance() for s in self.seeds if s in self.fleets},
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
            **(
                {
                    "rule_sweep": {
                        rule_point(p): self.combined(_rule_key(p))
                        for p in spec.rule_sweep
                        if self.done[_rule_key(p)]
                    }
                }
                if spec.rule_sweep
                else {}
            ),
            "wall_seconds": time.perf_counter() - self.t_start,
        }
        chosen = validation_choice(results)
        if chosen is not None:
            results["chosen"] = chosen
        return results


def is_pooled(method: str, config: SimConfig) -> bool:
    """Whether a method trains one pooled participant (CL) instead of the fleet's clients."""
    strategy = create_strategy(method, **dict(config.method_params.get(method, {})))
    return bool(getattr(strategy, "pooled", False))


def _summary(run: MethodRun) -> dict[str, Any]:
    out = run.summary()
    out.setdefault("transport", "inprocess")
    return out


def round_line(name: str, seed: int, record: RoundRecord, rounds: int) -> str:
    """One log line for a finished round (what ``fedepth bench --quiet`` prints instead of
    progress bars): the run, the round of how many, its training loss and time and, when the
    round was evaluated, the test Abs Rel over every sequence."""
    test = record.test["all"]["abs_rel"] if record.test else None
    val = record.validation["all"]["abs_rel"] if record.validation else None
    return (
        f"{name} seed {seed} round {record.round + 1}/{rounds}: loss {record.mean_loss:.3f}"
        + ("" if test is None else f", test abs_rel {test:.3f}")
        + ("" if val is None else f", validation abs_rel {val:.3f}")
        + f", training {record.train_seconds:.0f} s"
    )


def _one_line(name: str, summary: Mapping[str, Any], seed: int | None = None) -> str:
    at = "" if seed is None else f"seed {seed}  "
    return (
        f"{name:<18} {at}abs_rel {summary['abs_rel']:.3f}  rmse {summary['rmse']:.3f}"
        f"  d1 {summary['d1']:.3f}  clusters {len(summary['clusters']) or 1}"
        + (
            f"  validation abs_rel {summary['validation']['abs_rel']:.3f}"
            if "validation" in summary
            else ""
        )
    )
