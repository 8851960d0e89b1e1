"""Lite depth models on CPU: parameters, ms per frame at 96x128 and s per train step (batch 4).

Target: every ``*-lite`` model under 60 ms per frame, so a CPU robot node runs at >= 15 Hz.
Inference is timed in eval mode under ``torch.inference_mode``; a train step is
``forward_train`` + ``loss`` + backward + AdamW step on random data. Each figure is the median
of ``--repeats`` timed runs after ``--warmup`` untimed ones. One torch thread by default: on a
shared machine extra OpenMP threads contend with other processes and make timings erratic.

    python benchmarks/models.py [--threads N] [--json out.json] [--strict]

``--strict`` exits with status 1 when a model misses the target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedepth.losses import valid_mask
from fedepth.models import create_model, list_models

TARGET_MS = 60.0


def _median_seconds(fn: Callable[[], object], *, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_model(
    name: str, *, height: int, width: int, train_batch: int, warmup: int, repeats: int
) -> dict[str, float | str | bool]:
    """Parameters, inference ms per frame and train seconds per step of one model."""
    torch.manual_seed(0)
    model = create_model(name, min_depth=0.1, max_depth=10.0)
    params = sum(p.numel() for p in model.parameters())

    model.eval()
    frame = torch.rand(1, 3, height, width)

    def infer() -> None:
        with torch.inference_mode():
            model(frame)

    ms = 1000.0 * _median_seconds(infer, warmup=warmup, repeats=repeats)

    model.train()
    rgb = torch.rand(train_batch, 3, height, width)
    gt = 0.5 + 9.0 * torch.rand(train_batch, 1, height, width)
    valid = valid_mask(gt, model.min_depth, model.max_depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss, _ = model.loss(model.forward_train(rgb), gt, valid)
        loss.backward()
        opt.step()

    s_step = _median_seconds(step, warmup=max(1, warmup // 2), repeats=max(3, repeats // 3))
    return {
        "model": name,
        "params_m": params / 1e6,
        "ms_per_frame": ms,
        "s_per_train_step": s_step,
        "meets_target": ms < TARGET_MS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--models", default=None, help="comma-separated names (default: *-lite)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    names = args.models.split(",") if args.models else [m for m in list_models() if "-lite" in m]
    rows = [
        bench_model(
            n,
            height=args.height,
            width=args.width,
            train_batch=args.train_batch,
            warmup=args.warmup,
            repeats=args.repeats,
        )
        for n in names
    ]
    print(
        f"CPU, {args.threads} thread(s), input {args.height}x{args.width}, "
        f"train batch {args.train_batch}, target < {TARGET_MS:.0f} ms/frame"
    )
    print(f"{'model':<18}{'params (M)':>12}{'ms/frame':>10}{'s/step':>9}  target")
    for r in rows:
        print(
            f"{r['model']:<18}{r['params_m']:>12.2f}{r['ms_per_frame']:>10.1f}"
            f"{r['s_per_train_step']:>9.3f}  {'ok' if r['meets_target'] else 'MISSED'}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    missed = not all(r["meets_target"] for r in rows)
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
