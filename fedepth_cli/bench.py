"""``fedepth bench``, ``fedepth pretrain`` and ``fedepth demo``: the benchmark and its parts.

``--transport grpc`` is the one place that reaches into ``fedepth_coordinator``: the command
hands :func:`fedepth.bench.run_benchmark` the gRPC transport (``GrpcBench``), imported only
then, so the library never imports the coordinator.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedepth_cli.errors import CliError

if TYPE_CHECKING:
    from fedepth.transport import Transport


def _methods(text: str) -> tuple[str, ...]:
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


def _seeds(args: argparse.Namespace) -> tuple[int, ...]:
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


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


def _size(text: str | None) -> tuple[int, int] | None:
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


def _bench_spec(
    args: argparse.Namespace, methods: tuple[str, ...], sweep: tuple[float, ...]
) -> Any:
    from fedepth.bench import BenchSpec, check_weights, sim_config
    from fedepth.models import list_models

    seeds = _seeds(args)
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
        image_size=_size(args.image_size),
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


def _transport(name: str) -> Transport | None:
    """The transport ``--transport`` names (None: in-process); gRPC's is imported only here."""
    if name != "grpc":
        return None
    from fedepth_coordinator.benchrun import GrpcBench

    return GrpcBench


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _interrupted(out: Path) -> int:
    """Ctrl-C during a run: what is kept and how to go on (exit status 130, as the shell's)."""
    _log(
        f"interrupted: the finished runs and rounds are kept in {out / 'state'}; "
        "the same command continues from there"
    )
    return 130


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


def cmd_bench(args: argparse.Namespace) -> int:
    from fedepth.bench import (
        OutConflictError,
        check_out,
        format_table,
        round_line,
        run_benchmark,
    )
    from fedepth.data.holdout import ValidationSplitError

    spec = _bench_spec(args, _methods(args.methods), _sweep(args.sweep))
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
    try:
        if not spec.fresh:
            check_out(spec)  # before any data, pretraining or descriptors
        rounds = spec.sim.rounds
        results = run_benchmark(
            spec,
            echo=_log,
            # without progress bars, a line per round (a log read while the job runs)
            on_round=(
                (lambda name, seed, rec: _log(round_line(name, seed, rec, rounds)))
                if args.quiet
                else None
            ),
            transport=_transport(spec.transport),
        )
    except (OutConflictError, ValidationSplitError) as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        return _interrupted(spec.out)
    print(format_table(results))
    print(f"wrote {spec.out / 'results.json'}, {spec.out / 'report.md'} and figures")
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from fedepth.bench import sim_config
    from fedepth.data.scenario import load_scenario
    from fedepth.models import save_weights
    from fedepth.sim import pretrain

    if not args.data:
        raise CliError("--data DIR is required: the scenario whose pretraining split to use")
    root = Path(args.data)
    if not (root / "manifest.json").is_file():
        raise CliError(f"--data {root}: no manifest.json (make one with `fedepth data synth`)")
    cfg = sim_config(
        args.scenario,
        args.profile,
        model=args.backbone,
        encoder_init=args.encoder_init,
        seed=args.seed,
        image_size=_size(args.image_size),
        pretrain_steps=args.steps,
        pretrain_threads=args.threads,
    )
    scenario = load_scenario(root)
    try:
        model = pretrain(scenario, cfg, progress=not args.quiet)
    finally:
        scenario.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(model, out)
    print(f"wrote {out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from fedepth.bench import (
        DEMO_METHODS,
        DEMO_SPREAD,
        BenchSpec,
        OutConflictError,
        check_out,
        demo_config,
        demo_key,
        demo_verdict,
        format_table,
        run_benchmark,
    )

    seeds = _seeds(args)
    out = Path(args.out or "runs/demo")
    spec = BenchSpec(
        scenario="hpe",
        profile="small",
        methods=DEMO_METHODS,
        out=out,
        sim=demo_config(seeds[0]),
        cache_dir=Path(args.cache),
        executor=args.executor,
        seeds=seeds,
    )
    print(
        "fedepth demo: FedAvg vs FeDepth on the synthetic HPE scenario (41 robots, 11 unseen "
        f"test sequences), seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; "
        "data and pretraining are cached, a rerun on the same --out resumes",
        file=sys.stderr,
    )
    try:
        check_out(spec)
        results = run_benchmark(spec, echo=_log)
    except OutConflictError as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        return _interrupted(out)
    print(format_table(results))
    measured = DEMO_SPREAD if DEMO_SPREAD and DEMO_SPREAD.key == demo_key(spec.sim) else None
    print(demo_verdict(results, measured))
    print(f"report: {out / 'report.md'} (figures: predictions.png, curves.png, clusters.png)")
    return 0


def _bench_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("--scenario", required=True, choices=("hpe", "bmr"))
    q.add_argument(
        "--profile",
        default="small",
        choices=("smoke", "small", "paper"),
        help="data and run size (default: small)",
    )
    q.add_argument(
        "--backbone",
        default="newcrfs-lite",
        help="model name (default: newcrfs-lite; see docs/models.md)",
    )
    q.add_argument(
        "--encoder-init",
        choices=("imagenet", "random"),
        help="how the encoder's weights begin before pretraining: torchvision's ImageNet "
        "checkpoint (default; `fedepth weights` lists them) or random (the ablation)",
    )
    q.add_argument(
        "--seed",
        type=int,
        help="seed of the scenario, the pretraining and the training (default 0)",
    )
    q.add_argument(
        "--data",
        metavar="DIR",
        help="scenario directory (default: generated once into the cache)",
    )
    q.add_argument(
        "--cache",
        default=".cache/fedepth",
        metavar="DIR",
        help="where generated data and pretrained weights are kept",
    )
    q.add_argument("--image-size", metavar="HxW", help="training/eval resolution")
    q.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars (fedepth bench: one log line per round instead)",
    )


def add_parsers(sub: Any) -> None:
    """`fedepth bench`, `fedepth pretrain` and `fedepth demo`."""
    p = sub.add_parser(
        "bench",
        help="run FL methods on a scenario: results.json, report.md and figures",
        description="Generate (or reuse) the scenario, pretrain the initial model (or use "
        "--weights), then run each method and write DIR/results.json, DIR/report.md with the "
        "paper's tables, and PNG figures. With --seeds, every seed does all of it anew and "
        "the results are the mean and standard deviation over the seeds. FeDepth's tau (and "
        "hard clustering's) follows the paper: calibrated for 20% overlap on HPE, chosen to "
        "reproduce PACFL's partition on BMR; --sweep sets overlaps instead. "
        "Resuming: the same command on the same --out continues where it stopped. Finished "
        "(method, seed) runs are kept in DIR/state and loaded instead of run again; an "
        "interrupted method continues from its last finished round (a checkpoint is written "
        "after every round; with --transport grpc it restarts from round 0, finished runs "
        "are still skipped). Adding methods, sweep points or seeds to an existing --out runs "
        "only the missing ones; an --out holding a run with other settings (rounds, steps, "
        "backbone, image size, scenario, profile, transport, --data, --weights, ...) is "
        "refused: use another --out, or --fresh.",
    )
    _bench_args(p)
    p.add_argument(
        "--seeds",
        metavar="LIST",
        help="comma-separated seeds, e.g. 0,1,2 (integers >= 0, no repeats; not with --seed): "
        "each generates its own scenario (with --data: the given one), pretrains its own "
        "initial model (with --weights: the given one) and trains every method; results.json "
        "gives each metric's mean over the seeds, its sample standard deviation as "
        "<metric>_std and every seed's numbers under seeds",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: delete what an earlier run left in --out (state/, results, report, "
        "figures, grpc/ logs) instead of resuming it",
    )
    p.add_argument(
        "--methods",
        default="fedavg,pacfl,fedepth",
        help="comma-separated method names or 'all' (default: fedavg,pacfl,fedepth)",
    )
    p.add_argument(
        "--sweep",
        help="FeDepth overlap ratios to sweep, e.g. 0,0.2,1 or 'paper'; or one of FeDepth's "
        "rules with the names to sweep, merge=subsets,cliques, routing=within-tau,nearest or "
        "rules=PRESET,... (its other parameters as configured). With --validation-share, the "
        "point of lowest validation Abs Rel is marked 'chosen (validation)'",
    )
    p.add_argument(
        "--validation-share",
        type=float,
        metavar="F",
        help="hold out the share F in [0, 1) of every training client's frames, the tail of "
        "each of its sequences, from its training and score every method's served model on "
        "it in every evaluated round (validation next to test in results.json and report.md; "
        "a sweep's point is chosen on it); default 0: no validation split",
    )
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--weights", help="initial weights (safetensors) instead of pretraining")
    p.add_argument(
        "--rounds",
        type=_positive_int,
        help="communication rounds (default: the profile's; small: 16 on HPE, 32 on BMR)",
    )
    p.add_argument("--local-steps", type=_positive_int, help="local steps per round")
    p.add_argument(
        "--lr",
        type=_positive_float,
        help="learning rate of every client's local steps (default: the recipe's 1e-4), and "
        "of CL's unless cl.lr is given",
    )
    p.add_argument(
        "--round-schedule",
        choices=("constant", "cosine"),  # fedepth.recipe.ROUND_SCHEDULES (torch-free here)
        help="learning rate across rounds: constant (default) or cosine (to 0.1 x lr in the "
        "last round)",
    )
    p.add_argument(
        "--descriptor-layers",
        choices=("shallow", "deepest"),  # fedepth.models.base.DESCRIPTOR_LAYERS (torch-free here)
        help="encoder maps the client descriptor pools: shallow (default: every map of stride "
        "<= 8) or deepest (the deepest map alone); robots always describe with the default, "
        "so deepest needs the in-process transport",
    )
    p.add_argument(
        "--descriptor-encoder",
        choices=("model", "imagenet"),  # fedepth.sim.config.DESCRIPTOR_ENCODERS
        help="whose encoder the descriptor reads: model (default: the initial checkpoint's, "
        "pretrained for depth) or imagenet (the frozen ImageNet encoder alone); robots describe "
        "with the model's, so imagenet needs the in-process transport",
    )
    p.add_argument(
        "--method-param",
        action="append",
        metavar="METHOD.KEY=VALUE",
        help="a strategy parameter, repeatable, e.g. feddyn.alpha=0.01, fedprox.mu=0.1, "
        "fedepth.tau=0.5, fedavg.server_momentum=0.9, cl.lr=0.001 (an unknown one is refused "
        "with the method's parameters); VALUE is read as JSON where it parses; recorded with "
        "the run, so an --out resumes only with the same ones",
    )
    p.add_argument("--pretrain-steps", type=_positive_int, help="steps of the cached pretraining")
    p.add_argument(
        "--pretrain-threads",
        type=_positive_int,
        help="torch threads of the pretraining (default 2; the checkpoint depends on it, so "
        "another count is cached under its own name)",
    )
    p.add_argument(
        "--executor",
        default="sequential",
        choices=("sequential", "ray"),
        help="where client training runs (ray: local or existing Ray cluster)",
    )
    p.add_argument(
        "--transport",
        default="inprocess",
        choices=("inprocess", "grpc"),
        help="inprocess (default): the strategy and clients in this process; grpc: each "
        "method through a real fedepth-coordinator subprocess and one process per robot on "
        "loopback (same seed, same weights; slower; CL stays in-process; an interrupted "
        "method restarts from round 0). Logs in DIR/grpc (DIR/grpc/seed<S> with --seeds)",
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "pretrain",
        help="train the initial checkpoint on a scenario's pretraining split",
        description="Train the chosen backbone on the pretraining split (sequences no client "
        "holds) and save it as safetensors; the benchmark starts every method from it.",
    )
    _bench_args(p)
    p.add_argument("--steps", type=_positive_int, help="training steps (default: the profile's)")
    p.add_argument(
        "--threads",
        type=_positive_int,
        help="torch threads (default 2; the checkpoint depends on the count)",
    )
    p.add_argument("--out", required=True, metavar="weights.safetensors")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser(
        "demo",
        help="the embedded default job: FedAvg vs FeDepth on the HPE scenario",
        description="FedAvg and FeDepth on the synthetic HPE scenario (small profile data, a "
        "shorter federation than `fedepth bench --profile small`), client training on every "
        "core (Ray); prints the table and a verdict of FeDepth vs FedAvg with the seed spread "
        "(this run's with several seeds, else the one measured for this configuration). About 7 "
        "to 10 minutes the first time on a quiet 2-core AVX512 CPU (data synthesis and "
        "pretraining included), about 5 once the data and the pretrained model are cached; "
        "a busy or AVX2-only CPU takes up to twice as long.",
    )
    p.add_argument("--seed", type=int, default=None, help="one seed (default 0)")
    p.add_argument(
        "--seeds", default=None, metavar="LIST", help="several seeds, e.g. 0,1,2 (the spread)"
    )
    p.add_argument("--out", help="output directory (default: runs/demo)")
    p.add_argument("--cache", default=".cache/fedepth", metavar="DIR")
    p.add_argument(
        "--executor",
        choices=("ray", "sequential"),
        default="ray",
        help="ray (default): clients on every core; sequential: one after another",
    )
    p.set_defaults(func=cmd_demo)
