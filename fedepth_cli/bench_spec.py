"""``fedepth bench``'s arguments into a :class:`fedepth.bench.BenchSpec`: every bad argument
(an unknown method, parameter, rule, seed list, image size, weights file, a setting the gRPC
transport cannot run, a validation share a client cannot spare) is a :class:`CliError`, exit
status 2, before anything runs or is written."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedepth_cli.errors import CliError

if TYPE_CHECKING:
    from fedepth.bench import BenchSpec


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    """The benchmark ``fedepth bench`` runs, every argument checked (exit 2 on a bad one)."""
    spec = _bench_spec(args, method_names(args.methods), _sweep(args.sweep))
    if spec.transport == "grpc" and spec.sim.descriptor_layers != "shallow":
        raise CliError(
            "--descriptor-layers deepest: the robots of --transport grpc describe their data "
            "with the default (shallow) maps; use the in-process transport"
        )
    if spec.transport == "grpc" and spec.sim.descriptor_encoder != "model":
        raise CliError(
            "--descriptor-encoder imagenet: the robots of --transport grpc describe their data "
            "with the served model's encoder; use the in-process transport"
        )
    if spec.transport == "grpc" and spec.sim.validation_share > 0:
        raise CliError(
            "--validation-share: the robots of --transport grpc train on all of their frames "
            "and the coordinator scores no validation split; use the in-process transport"
        )
    if spec.transport == "grpc" and spec.executor != "sequential":
        raise CliError(
            "--transport grpc trains in one process per robot; --executor does not apply"
        )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} exists and is not a directory")
    if spec.data_dir is not None and spec.sim.validation_share > 0:
        _check_validation_split(spec.data_dir, spec.sim.validation_share)
    return spec


def _bench_spec(
    args: argparse.Namespace, methods: tuple[str, ...], sweep: tuple[float, ...]
) -> BenchSpec:
    from fedepth.bench import BenchSpec, check_weights, sim_config
    from fedepth.models import list_models

    seeds = seed_list(args)
    if args.backbone not in list_models():
        raise CliError(
            f"unknown backbone {args.backbone!r}; choose from {', '.join(list_models())}"
        )
    cfg = sim_config(
        args.scenario,
        args.profile,
        model=args.backbone,
        encoder_init=args.encoder_init,
        seed=seeds[0],
        rounds=args.rounds,
        local_steps=args.local_steps,
        lr=args.lr,
        round_schedule=args.round_schedule,
        descriptor_layers=args.descriptor_layers,
        descriptor_encoder=args.descriptor_encoder,
        image_size=image_size(args.image_size),
        pretrain_steps=args.pretrain_steps,
        pretrain_threads=args.pretrain_threads,
        validation_share=_validation_share(args.validation_share),
    )
    if args.method_param:
        params = _method_params(args.method_param, methods, cfg.method_params)
        cfg = replace(cfg, method_params=params)
    rules = _rule_sweep(args.sweep, cfg.method_params) if args.sweep and "=" in args.sweep else ()
    weights = Path(args.weights) if args.weights else None
    if weights is not None:
        if not weights.is_file():
            raise CliError(f"--weights {weights}: no such file")
        try:
            check_weights(cfg, weights)
        except Exception as exc:
            raise CliError(f"--weights {weights} does not fit {args.backbone}: {exc}") from exc
    data = Path(args.data) if args.data else None
    if data is not None and not (data / "manifest.json").is_file():
        raise CliError(f"--data {data}: no manifest.json (make one with `fedepth data synth`)")
    return BenchSpec(
        scenario=args.scenario,
        profile=args.profile,
        methods=methods,
        out=Path(args.out),
        sim=cfg,
        data_dir=data,
        cache_dir=Path(args.cache),
        weights=weights,
        sweep=sweep,
        executor=args.executor,
        progress=not args.quiet,
        transport=args.transport,
        seeds=seeds,
        fresh=args.fresh,
        rule_sweep=rules,
    )


def method_names(text: str) -> tuple[str, ...]:
    """``--methods``: comma-separated strategy names or ``all``."""
    from fedepth.bench import ALL_METHODS
    from fedepth.strategies import list_strategies

    if text == "all":
        return ALL_METHODS
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in list_strategies()]
    if unknown or not names:
        raise CliError(
            f"unknown method(s) {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(list_strategies())} or 'all'"
        )
    return names


def _sweep(text: str | None) -> tuple[float, ...]:
    from fedepth.bench import SWEEP

    if not text or "=" in text:  # a rule sweep: _rule_sweep
        return ()
    if text == "paper":
        return SWEEP
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError as exc:
        raise CliError(
            f"--sweep takes comma-separated ratios in [0, 1] or 'paper': {exc}"
        ) from exc
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise CliError("--sweep ratios must lie in [0, 1]")
    return values


def _rule_sweep(text: str, defaults: Any) -> tuple[tuple[str, str], ...]:
    """``--sweep RULE=NAME,NAME,...``: FeDepth under each named merge rule, routing rule or
    preset of both (its other parameters as configured); each point is built once here, so an
    unknown name is an error before anything runs."""
    from fedepth.bench.spec import RULE_SWEEP_KEYS
    from fedepth.strategies import create_strategy

    key, _, raw = text.partition("=")
    key = key.strip()
    names = list(dict.fromkeys(v.strip() for v in raw.split(",") if v.strip()))
    if key not in RULE_SWEEP_KEYS or not names:
        raise CliError(
            f"--sweep {text}: give overlap ratios (e.g. 0,0.2,1 or 'paper') or one of "
            f"FeDepth's rules with the names to sweep, {'=..., '.join(RULE_SWEEP_KEYS)}=..., "
            "e.g. merge=subsets,cliques"
        )
    own = dict(defaults.get("fedepth", {}))
    for name in names:
        try:
            create_strategy("fedepth", **{**own, key: name})
        except (TypeError, ValueError) as exc:
            raise CliError(f"--sweep {text}: {exc}") from None
    return tuple((key, name) for name in names)


def _method_params(
    given: list[str] | None, methods: tuple[str, ...], defaults: Any
) -> dict[str, dict[str, Any]]:
    """The strategies' parameters: the scenario's (``defaults``) with every ``--method-param
    METHOD.KEY=VALUE`` applied (VALUE read as JSON where it parses: numbers, true/false, null,
    lists; else as text). Each changed method is built once here, so a bad key or value is an
    error before anything runs."""
    import json

    from fedepth.strategies import create_strategy

    params = {m: dict(v) for m, v in defaults.items()}
    changed: set[str] = set()
    for text in given or ():
        name, eq, raw = text.partition("=")
        method, dot, key = name.strip().partition(".")
        if not (eq and dot and method and key.strip()):
            raise CliError(
                f"--method-param {text!r}: give METHOD.KEY=VALUE, e.g. feddyn.alpha=0.1"
            )
        if method not in methods:
            raise CliError(
                f"--method-param {text!r}: {method} is not run (--methods {','.join(methods)})"
            )
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        params.setdefault(method, {})[key.strip()] = value
        changed.add(method)
    for method in sorted(changed):
        known = _strategy_params(method)
        unknown = sorted(set(params[method]) - set(known))
        if unknown:
            raise CliError(
                f"--method-param: {method} has no parameter {', '.join(unknown)}; "
                f"its parameters: {', '.join(known) or '(none)'}"
            )
        try:
            create_strategy(method, **params[method])
        except (TypeError, ValueError) as exc:
            preset = defaults.get(method)
            also = (
                f" (the scenario sets {method} {json.dumps(dict(preset))}; "
                f"{method}.KEY=null unsets one)"
                if preset
                else ""
            )
            raise CliError(f"--method-param for {method}: {exc}{also}") from None
    return params


def _strategy_params(method: str) -> list[str]:
    """The keyword parameters ``create_strategy(method, ...)`` takes."""
    import inspect

    from fedepth.strategies import SERVER_OPTIMIZER, aggregates_clusterwise, create_strategy

    strategy = create_strategy(method)
    names = [
        name
        for name, p in inspect.signature(type(strategy)).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if aggregates_clusterwise(strategy):
        names += SERVER_OPTIMIZER
    return names


def seed_list(args: argparse.Namespace) -> tuple[int, ...]:
    """The seeds of a benchmark: ``--seeds LIST`` or ``--seed S`` (default 0), not both."""
    if args.seeds is not None and args.seed is not None:
        raise CliError("give --seed S (one seed) or --seeds LIST (several), not both")
    if args.seeds is None:
        seed = 0 if args.seed is None else args.seed
        if seed < 0:
            raise CliError(f"--seed must be >= 0, got {seed}")
        return (seed,)
    parts = [p.strip() for p in args.seeds.split(",")]
    if not any(parts):
        raise CliError("--seeds is empty; give comma-separated integers >= 0, e.g. 0,1,2")
    seeds: list[int] = []
    for part in parts:
        try:
            seed = int(part)
        except ValueError:
            raise CliError(
                f"--seeds {args.seeds}: {part!r} is not an integer (give e.g. 0,1,2)"
            ) from None
        if seed < 0:
            raise CliError(f"--seeds {args.seeds}: {seed} is negative; seeds must be >= 0")
        if seed in seeds:
            raise CliError(f"--seeds {args.seeds}: {seed} is given twice")
        seeds.append(seed)
    return tuple(seeds)


def image_size(text: str | None) -> tuple[int, int] | None:
    """``--image-size HxW``: both sides positive multiples of 16 (None: the profile's)."""
    if text is None:
        return None
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise CliError(f"--image-size takes HxW, e.g. 48x64, got {text!r}") from exc
    if h % 16 or w % 16 or h <= 0 or w <= 0:
        raise CliError(f"--image-size {text}: both sides must be positive multiples of 16")
    return (h, w)


def _validation_share(value: float | None) -> float | None:
    """``--validation-share F``: a share in [0, 1) (None: the default, no validation split)."""
    if value is not None and not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise CliError(
            f"--validation-share must lie in [0, 1) (the share of every training client's "
            f"frames held out of its training), got {value:g}"
        )
    return value


def _check_validation_split(data: Path, share: float) -> None:
    """Refuse, before anything is written, a validation share that leaves a client of the
    given scenario no training or no validation frame (a generated scenario is checked once
    it is generated, before pretraining)."""
    from fedepth.data.holdout import ValidationSplitError, holdout_validation
    from fedepth.data.scenario import load_scenario

    scenario = load_scenario(data)
    try:
        holdout_validation(scenario.clients, share)
    except ValidationSplitError as exc:
        raise CliError(str(exc)) from None
    finally:
        scenario.close()
