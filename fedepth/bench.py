"""The benchmark: every method on one scenario, written as results.json + report.md + pictures.

``run_benchmark`` prepares the scenario (generated once and cached), the initial checkpoint
(pretrained once on the scenario's pretraining split and cached, or a user's weights file), the
fleet's descriptors, then runs each method through :class:`fedepth.sim.Simulation` and writes:

- ``results.json``: ``methods.<name>.{abs_rel, sq_rel, rmse, rmse_log, d1, d2, d3}`` (mean over
  the last rounds) plus per-group numbers, per-round curves, bytes per round, timing, and the
  overlap sweep; ``config.json``: the resolved configuration;
- ``report.md``: tables laid out like the paper's (Table 1/2, 3a, 3b, 3c) and the figures;
- ``curves.png``, ``clusters.png`` (Jeffreys matrix and FeDepth's cluster map),
  ``predictions.png`` (RGB / ground truth / prediction per test sequence and method).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedepth import clustering
from fedepth.data.scenario import Scenario, load_scenario
from fedepth.descriptor import stack_descriptors
from fedepth.models import get_state, load_weights, save_weights
from fedepth.sim import (
    TABLE_METRICS,
    Fleet,
    MethodRun,
    SimConfig,
    Simulation,
    config_dict,
    initial_model,
    make_executor,
    prepare_fleet,
    pretrain,
)
from fedepth.strategies import create_strategy

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
    #: "inprocess" (the Simulation loop) or "grpc" (a real coordinator subprocess per method and
    #: one process per robot on loopback; see fedepth_coordinator.benchrun)
    transport: str = "inprocess"


#: Simulation sizes per data profile (every field can be overridden on the command line).
#: small: sized so one method's run takes a few minutes on a 2-core CPU; paper: starting points
#: for GPU machines at the paper's scale (KITTI-like input, 50 rounds).
PROFILE_SIM: dict[str, dict[str, Any]] = {
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


def sim_config(scenario: str, profile: str, **overrides: Any) -> SimConfig:
    """The simulation configuration of a scenario and profile, with overrides applied."""
    if profile not in PROFILE_SIM:
        raise ValueError(f"unknown profile {profile!r}; choose from {', '.join(PROFILE_SIM)}")
    fields = {**scenario_defaults(scenario), **PROFILE_SIM[profile]}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return SimConfig(**fields)


def scenario_defaults(scenario: str) -> dict[str, Any]:
    """Depth range of the scenario's single model: HPE and BMR both reach outdoor range (80 m);
    indoor sequences are still scored with their own 10 m cap."""
    if scenario not in ("hpe", "bmr"):
        raise ValueError(f"unknown scenario {scenario!r}; choose hpe or bmr")
    return {"min_depth": 1e-3, "max_depth": 80.0}


def ensure_data(spec: BenchSpec) -> Path:
    """The scenario directory: the given one, or generated once into the cache."""
    if spec.data_dir is not None:
        return spec.data_dir
    from fedepth.data.synth.generate import synthesize

    root = spec.cache_dir / "data" / f"{spec.scenario}-{spec.profile}-s{spec.sim.seed}"
    if not (root / "manifest.json").is_file():
        log.info("generating the %s/%s scenario into %s", spec.scenario, spec.profile, root)
        synthesize(spec.scenario, spec.profile, spec.sim.seed, root, progress=spec.progress)
    return root


def ensure_weights(spec: BenchSpec, scenario: Scenario) -> Path:
    """The initial checkpoint: the user's weights, or pretrained once and cached."""
    if spec.weights is not None:
        return spec.weights
    c = spec.sim
    name = (
        f"{spec.scenario}-{spec.profile}-{c.model}-{c.image_size[0]}x{c.image_size[1]}"
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


def run_benchmark(spec: BenchSpec, *, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the spec end to end; returns the results dict also written to results.json."""
    spec.out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    root = ensure_data(spec)
    scenario = load_scenario(root)
    weights = ensure_weights(spec, scenario)
    model = initial_model(spec.sim, str(weights))
    fleet = prepare_fleet(scenario, model, spec.sim, progress=spec.progress)
    initial = get_state(model)
    executor = make_executor(spec.executor)
    sim = Simulation(fleet, initial, spec.sim, executor)
    grpc = _grpc_bench(spec, fleet, initial)
    runs: dict[str, MethodRun] = {}
    sweep_runs: dict[float, MethodRun] = {}

    def collect() -> dict[str, Any]:
        return {
            "scenario": spec.scenario,
            "profile": spec.profile,
            "seed": spec.sim.seed,
            "backbone": spec.sim.model,
            "data_dir": str(root),
            "weights": str(weights),
            "num_clients": len(fleet.infos),
            "num_test_sequences": len(fleet.test_queries),
            "transport": spec.transport,
            "methods": {m: _summary(r) for m, r in runs.items()},
            "overlap_sweep": {f"{ratio:g}": _summary(r) for ratio, r in sweep_runs.items()},
            "wall_seconds": time.perf_counter() - t_start,
        }

    def checkpoint() -> None:  # results so far, so a long run can be watched or resumed by eye
        tmp = spec.out / "results.json.tmp"
        tmp.write_text(json.dumps(collect(), indent=2, default=_json))
        tmp.replace(spec.out / "results.json")

    # the runs through the coordinator, in order (method, strategy params; None: the config's)
    plan: list[tuple[str, dict[str, Any] | None]] = []
    if grpc is not None:
        plan = [(m, None) for m in spec.methods if not is_pooled(m, spec.sim)]
        plan += [("fedepth", _sweep_params(r)) for r in spec.sweep]

    def run_grpc(method: str, params: dict[str, Any] | None) -> MethodRun:
        plan.pop(0)
        return grpc.run(method, params, then=plan[0] if plan else None)

    try:
        if grpc is not None:  # robots start up while in-process methods run
            grpc.start(plan[0] if plan else None)
        for method in spec.methods:
            if grpc is not None and is_pooled(method, spec.sim):
                echo(f"{method}: one pooled participant, not a fleet of robots: run in-process")
                runs[method] = sim.run(method, progress=spec.progress)
            elif grpc is not None:
                runs[method] = run_grpc(method, None)
            else:
                runs[method] = sim.run(method, progress=spec.progress)
            echo(_one_line(method, runs[method]))
            checkpoint()
        for ratio in spec.sweep:
            if grpc is not None:
                sweep_runs[ratio] = run_grpc("fedepth", _sweep_params(ratio))
            else:
                params = dict(spec.sim.method_params)
                params["fedepth"] = _sweep_params(ratio)
                sweep_sim = Simulation(
                    fleet, initial, replace(spec.sim, method_params=params), executor
                )
                sweep_runs[ratio] = sweep_sim.run("fedepth", progress=spec.progress)
            echo(_one_line(sweep_name(ratio), sweep_runs[ratio]))
            checkpoint()
    finally:
        if grpc is not None:
            grpc.close()
        executor.close()
        scenario.close()
    results = collect()
    (spec.out / "config.json").write_text(
        json.dumps(
            {
                "sim": config_dict(spec.sim),
                "scenario": spec.scenario,
                "profile": spec.profile,
                "methods": list(spec.methods),
                "sweep": list(spec.sweep),
                "executor": spec.executor,
                "transport": spec.transport,
                "data_dir": str(root),
                "weights": str(weights),
            },
            indent=2,
        )
    )
    (spec.out / "results.json").write_text(json.dumps(results, indent=2, default=_json))
    write_figures(spec.out, fleet, runs, spec.sim)
    (spec.out / "report.md").write_text(render_report(results, fleet))
    return results


def _grpc_bench(spec: BenchSpec, fleet: Fleet, initial: dict[str, np.ndarray]) -> Any:
    """The gRPC runner (None for the in-process transport); grpc is imported only here."""
    if spec.transport == "inprocess":
        return None
    if spec.transport != "grpc":
        raise ValueError(f"unknown transport {spec.transport!r}; choose inprocess or grpc")
    from fedepth_coordinator.benchrun import GrpcBench

    return GrpcBench(fleet, initial, spec.sim, spec.out / "grpc", progress=spec.progress)


def is_pooled(method: str, config: SimConfig) -> bool:
    """Whether a method trains one pooled participant (CL) instead of the fleet's clients."""
    strategy = create_strategy(method, **dict(config.method_params.get(method, {})))
    return bool(getattr(strategy, "pooled", False))


def _summary(run: MethodRun) -> dict[str, Any]:
    out = run.summary()
    out.setdefault("transport", "inprocess")
    return out


def _json(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _one_line(name: str, run: MethodRun) -> str:
    f = run.final
    return (
        f"{name:<18} abs_rel {f['abs_rel']:.3f}  rmse {f['rmse']:.3f}  d1 {f['d1']:.3f}"
        f"  clusters {len(run.clusters) or 1}"
    )


# -- report -------------------------------------------------------------------------------------
def _table(
    rows: Sequence[tuple[str, dict[str, Any]]],
    cols: Sequence[str],
    header: Sequence[str] | None = None,
) -> str:
    head = header or cols
    lines = [
        "| Method | " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head) + " |",
    ]
    for name, vals in rows:
        cells = [f"{vals[c]:.3f}" if isinstance(vals.get(c), (int, float)) else "-" for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_report(results: dict[str, Any], fleet: Fleet) -> str:
    """Markdown report with the paper's table layout."""
    m = results["methods"]
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
        f"Backbone `{results['backbone']}`, seed {results['seed']}, "
        f"{results['num_clients']} clients, {results['num_test_sequences']} unseen test "
        f"sequences; numbers are means over the last rounds (see config.json). "
        f"Wall time {results['wall_seconds'] / 60:.1f} min.",
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
        _table([(k, v) for k, v in m.items()], TABLE_METRICS, arrows),
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
            "| Abs Rel ↓ | " + " | ".join(f"{sweep[r]['abs_rel']:.3f}" for r in ratios) + " |",
            "| clusters K | "
            + " | ".join(str(len(sweep[r]["clusters"]) or 1) for r in ratios)
            + " |",
            "",
            "100 % means one cluster holding every client (tau = infinity); a "
            "target is met by the smallest tau whose merged map comes closest to it.",
            "",
        ]
    group_names = sorted({g for v in m.values() for g in v["groups"]})
    if group_names:
        cols = [*group_names, "all"]
        rows = [
            (k, {**{g: v["groups"][g]["abs_rel"] for g in v["groups"]}, "all": v["abs_rel"]})
            for k, v in m.items()
        ]
        out += [
            "## Table 3c: Abs Rel per platform and environment of the test sequences",
            "",
            _table(rows, cols, [g.split(":", 1)[1] for g in group_names] + ["All"]),
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
        "here, so both fractions compare the server's work with the fleet's summed training time.",
        "",
        "## Figures",
        "",
        "![convergence](curves.png)",
        "",
        "![Jeffreys matrix and cluster map](clusters.png)",
        "",
        "![predictions](predictions.png)",
        "",
    ]
    return "\n".join(out)


def write_figures(out: Path, fleet: Fleet, runs: dict[str, MethodRun], config: SimConfig) -> None:
    """curves.png, clusters.png and predictions.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, run in runs.items():
        rounds = [r.round + 1 for r in run.rounds]
        axes[0].plot(rounds, [r.mean_loss for r in run.rounds], label=name)
        pts = [(r.round + 1, r.test["all"]["abs_rel"]) for r in run.rounds if r.test]
        if pts:
            axes[1].plot(*zip(*pts, strict=True), marker="o", label=name)
    axes[0].set(title="mean local training loss", xlabel="round")
    axes[1].set(title="test Abs Rel (routed models)", xlabel="round")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)

    means, variances = stack_descriptors([i.descriptor for i in fleet.infos if i.descriptor])
    A = clustering.jeffreys_matrix(means, variances)
    fed = runs.get("fedepth")
    tau = fed.params.get("tau") if fed else None
    if tau is None:
        tau = clustering.calibrate_tau(A, 0.2)
    m_star = clustering.soft_clustering(A, float(tau)).M_star
    names = [
        f"{i.labels.get('platform', '')[:4]}/{i.labels.get('environment', '')[:7]}"
        for i in fleet.infos
    ]
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

    shown = list(runs)[:4]
    seqs = [s.name for s, _, _ in fleet.test_queries][:6]
    if not shown or not seqs:
        return
    cols = 2 + len(shown)
    fig, axes = plt.subplots(len(seqs), cols, figsize=(2.2 * cols, 1.8 * len(seqs)), squeeze=False)
    for r, seq in enumerate(seqs):
        first = runs[shown[0]].samples.get(seq)
        if not first:
            continue
        rgb, gt, _ = first[0]
        vmax = float(np.percentile(gt[gt > 0], 95)) if (gt > 0).any() else 1.0
        axes[r, 0].imshow(rgb)
        axes[r, 1].imshow(np.where(gt > 0, gt, np.nan), cmap="magma_r", vmin=0, vmax=vmax)
        for c, name in enumerate(shown):
            sample = runs[name].samples.get(seq)
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
    return "\n".join(rows)
