"""``fedepth bench``, ``fedepth pretrain`` and ``fedepth demo``: their parsers and help text.

What the arguments become is :mod:`fedepth_cli.bench_spec` (a checked
:class:`fedepth.bench.BenchSpec`); what each command does and prints is
:mod:`fedepth_cli.bench_run`.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from fedepth_cli.bench_run import cmd_bench, cmd_demo, cmd_pretrain

__all__ = ["add_parsers", "cmd_bench", "cmd_demo", "cmd_pretrain"]


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
