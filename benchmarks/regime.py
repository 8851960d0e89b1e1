"""Training-regime ablations: one model trained on pooled frames, scored on the unseen test set.

``fedepth bench`` compares federated methods from a pretrained checkpoint; this script answers
the question before it: does a recipe learn depth at all, and what does each setting change?
It trains one model with ONE optimizer (AdamW, linear warmup then cosine decay to 2 % of the
peak learning rate, as :func:`fedepth.sim.pretrain` does) on the frames of a scenario split and
scores every unseen test sequence the way the benchmark does
(:func:`fedepth.sim.evaluate_sequence`: the mean over evenly spread frames of the per-image
metrics), printing the mean and every sequence, so a change that helps one domain and hurts
another shows. Without ``--data`` it runs a few steps on a generated smoke scenario (what
``make bench`` does, to check the script still works).

Splits: ``pretrain`` (the scenario's pretraining sequences: what the initial checkpoint sees),
``pooled`` (pretraining plus every client's sequences: the centralised upper bound's data).

    python benchmarks/regime.py --data .cache/fedepth/data/hpe-small-s0 --split pooled \\
        --steps 2000 --lr 2e-3 --image-size 64x96 --variance-focus 0.5 [--eval-every 500]

Change one setting per run to measure its effect alone; docs/results-history.md lists the runs
made.
Runs on ``--threads`` torch threads (default 1, so two runs can share a 2-core machine), on the
CPU unless ``--device cuda`` (then with bf16 autocast, as a robot with a GPU trains; add
``--workers`` to load frames in parallel).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedepth.data.scenario import load_scenario
from fedepth.data.torchdata import FrameDataset
from fedepth.models import load_weights
from fedepth.optconfig import OptimizerConfig, TrainConfig
from fedepth.sim import SimConfig, evaluate_sequence
from fedepth.training import LocalTrainer
from fedepth_ros.learner import resolve_device

#: Ranges (uniform) of ``--photometric``: NeWCRFs' ``augment_image`` with its NYUv2 brightness
#: range, applied to half the items; depth and geometry are untouched, so metric scale is kept.
PHOTOMETRIC = {"gamma": (0.9, 1.1), "brightness": (0.75, 1.25), "gain": (0.9, 1.1)}


class Recolored(FrameDataset):
    """A FrameDataset whose items are, half of them, given a random gamma, brightness and
    per-channel gain (drawn from ``(seed, epoch, index)`` like the flips: reproducible)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rgb, depth = super().__getitem__(index)
        rng = np.random.default_rng([self.seed, self.epoch, int(index), 1])
        if rng.random() < 0.5:
            gamma = rng.uniform(*PHOTOMETRIC["gamma"])
            gain = rng.uniform(*PHOTOMETRIC["gain"], size=3) * rng.uniform(
                *PHOTOMETRIC["brightness"]
            )
            scale = torch.as_tensor(gain, dtype=rgb.dtype).view(3, 1, 1)
            rgb = (rgb.clamp(min=0) ** gamma * scale).clamp(0, 1)
        return rgb, depth


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean Abs Rel and delta<1.25 over per-sequence rows."""
    return {k: float(np.mean([r[k] for r in rows])) for k in ("abs_rel", "d1")}


def _size(text: str) -> tuple[int, int]:
    h, w = (int(v) for v in text.lower().split("x"))
    return h, w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="scenario directory (default: a smoke scenario)")
    ap.add_argument("--split", choices=("pretrain", "pooled"), default="pooled")
    ap.add_argument("--backbone", default="newcrfs-lite")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of steps in warmup")
    ap.add_argument("--image-size", type=_size, default=(64, 96), metavar="HxW")
    ap.add_argument("--variance-focus", type=float, default=0.85, help="SILog lambda")
    ap.add_argument("--max-depth", type=float, default=80.0)
    ap.add_argument("--eval-frames", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=0, help="also score every N steps")
    ap.add_argument(
        "--photometric",
        action="store_true",
        help="also augment colours (gamma, brightness, per-channel gain), as NeWCRFs does",
    )
    ap.add_argument(
        "--init", type=Path, help="start from these weights (default: a freshly built model)"
    )
    ap.add_argument(
        "--score-train",
        action="store_true",
        help="also score the training sequences at the end (the generalisation gap)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--device",
        default="cpu",
        help="where to train and score: cpu (default), cuda, cuda:N or auto (CUDA when present)",
    )
    ap.add_argument(
        "--workers", type=int, default=0, help="data-loading processes (0: in the main one)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the final numbers here")
    args = ap.parse_args()
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        ap.error(f"--device: {exc}")

    torch.set_num_threads(args.threads)
    if args.data is None:
        from fedepth.data.synth.generate import synthesize

        args.data = Path(tempfile.mkdtemp(prefix="fedepth-regime-"))
        synthesize("hpe", "smoke", args.seed, args.data, progress=False)
        args.steps, args.image_size, args.eval_every = 20, (32, 48), 0
        print(f"no --data: {args.steps} steps on a smoke scenario in {args.data}")
    scenario = load_scenario(args.data)
    frames = list(scenario.pretrain)
    if args.split == "pooled":
        frames += [s for c in scenario.clients for s in c.sequences]
    cfg = SimConfig(
        model=args.backbone,
        image_size=args.image_size,
        max_depth=args.max_depth,
        variance_focus=args.variance_focus,
        eval_frames=args.eval_frames,
        seed=args.seed,
    )
    torch.manual_seed(args.seed)
    model = cfg.build_model()
    if args.init is not None:
        load_weights(model, args.init)
    kind = Recolored if args.photometric else FrameDataset
    dataset = kind(frames, args.image_size, flip=True, seed=args.seed)

    def score() -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        rows = {seq.name: evaluate_sequence(model, seq, cfg)[0] for seq in scenario.test}
        mean = _mean(list(rows.values()))
        model.train()
        return mean, rows

    start = time.perf_counter()
    losses: list[float] = []

    def on_step(step: int, loss: float) -> None:
        losses.append(loss)
        done = step + 1
        if args.eval_every and done % args.eval_every == 0 and done < args.steps:
            mean, _ = score()
            print(
                f"step {done:5d}  loss {np.mean(losses[-50:]):.3f}  abs_rel {mean['abs_rel']:.3f}"
                f"  d1 {mean['d1']:.3f}  {time.perf_counter() - start:.0f} s",
                flush=True,
            )

    trainer = LocalTrainer(
        model,
        config=TrainConfig(
            num_steps=args.steps,
            batch_size=args.batch,
            optimizer=OptimizerConfig(
                lr=args.lr,
                schedule="cosine",
                warmup_steps=min(round(args.warmup * args.steps), args.steps - 1),
                final_lr_fraction=0.02,
            ),
            seed=args.seed,
            device=str(device),
            num_workers=args.workers,
        ),
    )
    trainer.fit(dataset, on_step=on_step)
    mean, rows = score()
    seconds = time.perf_counter() - start
    print(
        f"final  split {args.split}  steps {args.steps}  size {args.image_size}  "
        f"lambda {args.variance_focus}  lr {args.lr:g}  photometric {args.photometric}  "
        f"init {args.init}  device {device}:  abs_rel {mean['abs_rel']:.3f}  "
        f"d1 {mean['d1']:.3f}  ({seconds:.0f} s)"
    )
    for name, r in rows.items():
        print(f"  {name:42s} abs_rel {r['abs_rel']:.3f}  d1 {r['d1']:.3f}")
    seen: dict[str, float] = {}
    if args.score_train:
        train_rows = [evaluate_sequence(model, seq, cfg)[0] for seq in frames]
        seen = _mean(train_rows)
        print(
            f"training sequences ({len(train_rows)}): abs_rel {seen['abs_rel']:.3f}  "
            f"d1 {seen['d1']:.3f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "mean": mean,
                    "per_sequence": rows,
                    "training_sequences": seen,
                    "seconds": seconds,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
