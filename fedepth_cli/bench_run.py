"""``fedepth bench``, ``fedepth pretrain`` and ``fedepth demo`` run: each command's work and
what it prints (its arguments checked by :mod:`fedepth_cli.bench_spec`).

``--transport grpc`` is the one place that reaches into ``fedepth_coordinator``: the command
hands :func:`fedepth.bench.run_benchmark` the gRPC transport (``GrpcBench``), imported only
then, so the library never imports the coordinator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedepth_cli.bench_spec import image_size, seed_list, spec_from_args
from fedepth_cli.errors import CliError

if TYPE_CHECKING:
    from fedepth.transport import Transport


def cmd_bench(args: argparse.Namespace) -> int:
    from fedepth.bench import (
        OutConflictError,
        check_out,
        format_table,
        round_line,
        run_benchmark,
    )
    from fedepth.data.holdout import ValidationSplitError

    spec = spec_from_args(args)
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
        image_size=image_size(args.image_size),
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

    seeds = seed_list(args)
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
