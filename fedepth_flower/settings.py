"""The Flower App's run config (``[tool.flwr.app.config]``, ``flwr run --run-config``) read into
the benchmark's :class:`~fedepth.bench.BenchSpec` plus the federation's own settings.

Every key, its default and meaning are in :data:`DEFAULTS` (``examples/flower/pyproject.toml``
lists the same). A key the App does not know, an unknown method (or CL, which is not a
federation), scenario, profile or backbone is refused with one error that names it, before
anything runs. Relative paths are taken from the ServerApp's working directory; pass absolute
ones (Flower runs the App from a copy under ``$FLWR_HOME``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fedepth.bench import SIM_SIZES, BenchSpec, sim_config
from fedepth.models import list_models
from fedepth.strategies import aggregates_clusterwise, create_strategy, list_strategies
from fedepth.strategies.aggregate import AGGREGATIONS
from fedepth_flower.records import RecordError, get_float, get_int

N = TypeVar("N", int, float)

#: ``BenchSpec.transport`` of the runs through Flower (recorded in results.json).
TRANSPORT = "flower"

#: The run config: key -> default. Empty strings and zeros mean "the benchmark's default".
DEFAULTS: dict[str, str | int | float | bool] = {
    # what to run, as `fedepth bench --scenario --profile --methods --seed`
    "scenario": "hpe",
    "profile": "smoke",
    "methods": "fedavg,fedepth",
    "seed": 0,
    # the scenario directory (`fedepth data synth` output); "": generated into cache-dir
    "data-dir": "",
    "cache-dir": ".cache/fedepth",
    "out": "runs/flower",
    # initial weights (a safetensors file); "": pretrained once into cache-dir, as the bench
    "weights": "",
    # the model; "": the profile's
    "backbone": "",
    # the profile's rounds and local steps unless > 0
    "rounds": 0,
    "local-steps": 0,
    # start over instead of resuming what an earlier run left in out
    "fresh": False,
    # nodes to wait for before the descriptor round (0: one per training client of the
    # scenario), and for how long at most; then the run goes on with the nodes there
    "min-nodes": 0,
    "node-wait-s": 120.0,
    # seconds a round waits for the nodes' replies
    "round-timeout-s": 3600.0,
    # share of the nodes that score their own model on their own data after each round
    "fraction-evaluate": 0.0,
    # each cluster's aggregate, as the coordinator's validation.robust_aggregation: mean (the
    # data-size weighted mean) | trimmed_mean (trim-fraction cut at each end) | median
    "robust-aggregation": "mean",
    "trim-fraction": 0.2,
}


class RunConfigError(ValueError):
    """The run config asks for something the App cannot run (the message names the key)."""


@dataclass(frozen=True)
class AppSettings:
    """What the ServerApp runs: the benchmark's spec and the federation's settings."""

    spec: BenchSpec
    min_nodes: int
    node_wait_s: float
    round_timeout_s: float
    fraction_evaluate: float
    robust_aggregation: str = "mean"
    trim_fraction: float = 0.2


def _methods(text: str) -> tuple[str, ...]:
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    if not methods:
        raise RunConfigError("methods: name at least one method")
    known = [m for m in list_strategies() if not getattr(create_strategy(m), "pooled", False)]
    for m in methods:
        if m in list_strategies() and m not in known:
            raise RunConfigError(
                f"methods: {m!r} trains one pooled participant, not a federation of nodes; "
                "run it with `fedepth bench`"
            )
        if m not in known:
            raise RunConfigError(f"methods: unknown strategy {m!r}; known: {', '.join(known)}")
    return methods


def _number(config: Mapping[str, object], key: str, kind: type[N]) -> N:
    try:
        value = get_int(config, key) if kind is int else get_float(config, key)
    except RecordError as exc:
        raise RunConfigError(str(exc)) from None
    return kind(value)


def _path(value: object) -> Path | None:
    text = str(value).strip()
    return Path(text).expanduser().absolute() if text else None


def settings_from_run_config(run_config: Mapping[str, object]) -> AppSettings:
    """The App's settings from a run config (missing keys take :data:`DEFAULTS`)."""
    unknown = sorted(set(run_config) - set(DEFAULTS))
    if unknown:
        raise RunConfigError(
            f"unknown run config key(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}"
        )
    c = {**DEFAULTS, **run_config}
    scenario, profile = str(c["scenario"]), str(c["profile"])
    if scenario not in ("hpe", "bmr"):
        raise RunConfigError(f"scenario: unknown scenario {scenario!r}; choose hpe or bmr")
    if profile not in SIM_SIZES:
        raise RunConfigError(
            f"profile: unknown profile {profile!r}; choose from {', '.join(SIM_SIZES)}"
        )
    backbone = str(c["backbone"]).strip()
    if backbone and backbone not in list_models():
        raise RunConfigError(
            f"backbone: unknown model {backbone!r}; choose from {', '.join(list_models())}"
        )
    seed, rounds, steps = (_number(c, k, int) for k in ("seed", "rounds", "local-steps"))
    cfg = sim_config(
        scenario,
        profile,
        seed=seed,
        model=backbone or None,
        rounds=rounds if rounds > 0 else None,
        local_steps=steps if steps > 0 else None,
    )
    methods = _methods(str(c["methods"]))
    data, weights = _path(c["data-dir"]), _path(c["weights"])
    if data is not None and not (data / "manifest.json").is_file():
        raise RunConfigError(
            f"data-dir: {data} has no manifest.json (make one with `fedepth data synth`)"
        )
    if weights is not None and not weights.is_file():
        raise RunConfigError(f"weights: {weights}: no such file")
    out, cache = _path(c["out"]), _path(c["cache-dir"])
    if out is None or cache is None:
        raise RunConfigError("out and cache-dir must name directories")
    spec = BenchSpec(
        scenario=scenario,
        profile=profile,
        methods=methods,
        out=out,
        sim=cfg,
        data_dir=data,
        cache_dir=cache,
        weights=weights,
        progress=False,
        transport=TRANSPORT,
        seeds=(seed,),
        fresh=bool(c["fresh"]),
    )
    fraction = _number(c, "fraction-evaluate", float)
    if not 0.0 <= fraction <= 1.0:
        raise RunConfigError(f"fraction-evaluate must lie in [0, 1], got {fraction}")
    robust, trim = str(c["robust-aggregation"]), _number(c, "trim-fraction", float)
    if robust not in AGGREGATIONS:
        raise RunConfigError(
            f"robust-aggregation: unknown rule {robust!r}; choose from {', '.join(AGGREGATIONS)}"
        )
    if not 0.0 <= trim < 0.5:
        raise RunConfigError(f"trim-fraction must lie in [0, 0.5), got {trim}")
    if robust != "mean":
        own = [m for m in methods if not aggregates_clusterwise(create_strategy(m))]
        if own:
            raise RunConfigError(
                f"robust-aggregation {robust!r}: {', '.join(own)} aggregate(s) by their own "
                "rule; use 'mean' with them"
            )
    return AppSettings(
        spec=spec,
        min_nodes=_number(c, "min-nodes", int),
        node_wait_s=_number(c, "node-wait-s", float),
        round_timeout_s=_number(c, "round-timeout-s", float),
        fraction_evaluate=fraction,
        robust_aggregation=robust,
        trim_fraction=trim,
    )
