"""What a benchmark runs: :class:`BenchSpec`, the methods and sweep, each profile's sizes.

:data:`ALL_METHODS` in table order, the overlap ratios of Table 3b (:data:`SWEEP`) and the name
of a sweep point, and the simulation half of each profile (:data:`SIM_SIZES`, turned into a
:class:`~fedepth.sim.SimConfig` by :func:`sim_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedepth.depth_range import FLEET
from fedepth.sim import SimConfig

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

#: FeDepth's parameters a rule sweep (``--sweep merge=subsets,cliques``) can vary: the merge
#: rule, the routing rule, or a preset of both (fedepth.cluster_rules).
RULE_SWEEP_KEYS = ("merge", "routing", "rules")


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
    #: FeDepth's rule sweep: (parameter, value) points, e.g. (("merge", "subsets"), ("merge",
    #: "cliques")), each run with FeDepth's configured parameters and that one replaced
    #: (parameters: :data:`RULE_SWEEP_KEYS`)
    rule_sweep: tuple[tuple[str, str], ...] = ()

    @property
    def seed_list(self) -> tuple[int, ...]:
        return self.seeds or (self.sim.seed,)


#: The simulation half of each profile (every field can be overridden on the command line).
#: A profile (``--profile``: smoke, small, paper) names a size of everything: its data half,
#: the synthetic scenario's sizes, is :data:`fedepth.data.synth.scenarios.DATA_SIZES`.
#: small: sized so one method's run takes 7-15 minutes on a quiet 2-core AVX512 Xeon (two to
#: three times as long on slower CPU kernels) with FeDepth's test curve flat over the averaged
#: rounds on HPE (docs/results.md; BMR runs twice as many rounds, :data:`SCENARIO_SIM_SIZES`,
#: and still falls 3-4 % at its end); paper: starting points for GPU machines at the paper's
#: scale (KITTI-like input, 50 rounds).
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
        # 16, not 12: FeDepth's HPE test curve (seed 0, machine 4) falls until round 13 and is
        # flat after it (docs/results.md, "HPE small, seed 0, 24 rounds"); 12 averaged the descent
        "rounds": 16,
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


#: Where one scenario needs another size than its profile's (applied over :data:`SIM_SIZES`).
SCENARIO_SIM_SIZES: dict[tuple[str, str], dict[str, Any]] = {
    # 32, not 16: BMR's clustered test curves still fall 9 % over rounds 12-16 and 3.0-3.7 %
    # over rounds 28-32 (seed 0, machine 2; flat to 2 % needs about 45 rounds), and 32 rounds
    # are what one method's run fits in 15 minutes there (13.4 min; docs/results.md, "To 32
    # rounds"). HPE's curves are flat from round 13, so HPE keeps the profile's 16.
    ("bmr", "small"): {"rounds": 32},
}


def sim_config(scenario: str, profile: str, **overrides: Any) -> SimConfig:
    """The simulation configuration of a scenario and profile, with overrides applied."""
    if profile not in SIM_SIZES:
        raise ValueError(f"unknown profile {profile!r}; choose from {', '.join(SIM_SIZES)}")
    fields = {
        **scenario_defaults(scenario),
        **SIM_SIZES[profile],
        **SCENARIO_SIM_SIZES.get((scenario, profile), {}),
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return SimConfig(**fields)


def scenario_defaults(scenario: str) -> dict[str, Any]:
    """What a scenario fixes besides the profile's sizes.

    Depth range of the scenario's single model: HPE and BMR both reach outdoor range (80 m);
    indoor sequences are still scored with their own 10 m cap. FeDepth's threshold, as in the
    paper: on HPE calibrated for 20 % overlap (the strategies' default); on BMR chosen so that
    the clusters best reproduce the hard clustering's (PACFL's) partition, for FeDepth and for
    hard clustering at its threshold (``match: pacfl``; an overlap sweep still sets overlaps).
    """
    if scenario not in ("hpe", "bmr"):
        raise ValueError(f"unknown scenario {scenario!r}; choose hpe or bmr")
    out: dict[str, Any] = {"min_depth": FLEET.min_depth, "max_depth": FLEET.max_depth}
    if scenario == "bmr":
        out["method_params"] = {"fedepth": {"match": "pacfl"}, "hard": {"match": "pacfl"}}
    return out


def sweep_name(ratio: float) -> str:
    return f"fedepth@{round(ratio * 100):d}%"


def rule_point(point: tuple[str, str]) -> str:
    """A rule-sweep point as results.json keys it: ``merge=cliques``."""
    return f"{point[0]}={point[1]}"


def rule_sweep_name(point: tuple[str, str]) -> str:
    return f"fedepth {rule_point(point)}"
