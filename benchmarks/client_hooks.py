"""Client time of FedProx, FedDyn and SCAFFOLD against FedAvg: one local round, fused hooks and
the per-tensor loops they replaced.

One local round is ``LocalTrainer.fit`` of the small profile's model (the lite default,
``sim_config("hpe", "small")``, as benchmarks/local_round.py builds it) for ``--steps`` steps of
the profile's batch on random frames at its resolution (as benchmarks/overhead.py does), from
the same initial state every time, with FedAvg's hooks (none) or one algorithm's client hook:
the fused one (fedepth.strategies) or the reference loop (tests/strategies/test_fused_hooks.py,
the code the test proves the fused hooks equal to). Within a repeat every variant runs once, in
turn, so a busy machine slows them alike; each figure is the median over ``--repeats``, of wall
time and of the process's CPU time (which leaves out waits for a core another process holds).

Target (issue 48): FedProx / FedDyn / SCAFFOLD client time <= 1.10 x FedAvg's. The last column
says whether the fused hook's weights (and uploads) equal the reference's bit for bit on this
model.

    python benchmarks/client_hooks.py [--steps 10] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch.utils.data import TensorDataset

from fedepth.bench import sim_config
from fedepth.models import get_state
from fedepth.models.state import State
from fedepth.strategies import FedDynHook, FedProxHook, ScaffoldHook
from fedepth.training import LocalTrainer, TrainHook, TrainResult, trainable_parameters

TARGET = 1.10
REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "strategies" / "test_fused_hooks.py"


def _reference_hooks() -> ModuleType:
    """The test file that keeps the per-tensor loop hooks (RefFedProxHook, ...)."""
    spec = importlib.util.spec_from_file_location("fused_hooks_reference", REFERENCE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {REFERENCE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _variants(
    params: dict[str, torch.nn.Parameter],
) -> dict[str, Callable[[], list[TrainHook]]]:
    """Hook factories by variant name; states as a client holds them after a first round."""
    rng = np.random.default_rng(0)

    def state(scale: float) -> State:
        return {
            n: (scale * rng.standard_normal(p.shape)).astype(np.float32) for n, p in params.items()
        }

    grad, c, ci = state(1e-3), state(1e-3), state(1e-3)
    ref = _reference_hooks()
    mu, alpha = 0.01, 0.01  # the strategies' defaults
    return {
        "fedavg": lambda: [],
        "fedprox": lambda: [FedProxHook(mu=mu)],
        "fedprox-ref": lambda: [ref.RefFedProxHook(mu=mu)],
        "feddyn": lambda: [FedDynHook(alpha=alpha, grad_state=grad)],
        "feddyn-ref": lambda: [ref.RefFedDynHook(alpha=alpha, grad_state=grad)],
        "scaffold": lambda: [ScaffoldHook(server_control=c, client_control=ci)],
        "scaffold-ref": lambda: [ref.RefScaffoldHook(server_control=c, client_control=ci)],
    }


def _same(a: TrainResult, b: TrainResult) -> str:
    """'yes' when weights and extras are equal bit for bit, else the largest difference."""
    pairs = [(a.state, b.state)] + [(a.extra[k], b.extra[k]) for k in a.extra]
    worst = 0.0
    for x, y in pairs:
        for name in x:
            u, v = torch.from_numpy(np.asarray(x[name])), torch.from_numpy(np.asarray(y[name]))
            if not torch.equal(u, v):
                worst = max(worst, float((u.double() - v.double()).abs().max()))
    return "yes" if worst == 0.0 else f"no ({worst:.1e})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="local steps of the timed round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = sim_config("hpe", "small", local_steps=args.steps)
    torch.manual_seed(0)
    model = cfg.build_model()
    init = get_state(model)
    h, w = cfg.image_size
    n_frames = max(2 * cfg.batch_size, 8)
    data = TensorDataset(torch.rand(n_frames, 3, h, w), 1.0 + 20.0 * torch.rand(n_frames, 1, h, w))
    trainer = LocalTrainer(model, config=replace(cfg.train_config(seed=0), num_steps=args.steps))
    variants = _variants(trainable_parameters(model))

    def fit(name: str) -> tuple[float, float, TrainResult]:
        wall, cpu = time.perf_counter(), time.process_time()
        result = trainer.fit(data, state=init, hooks=variants[name]())
        return time.perf_counter() - wall, time.process_time() - cpu, result

    fit("fedavg")  # warm-up: allocator, kernels
    walls: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    results: dict[str, TrainResult] = {}
    for _ in range(args.repeats):
        for name in variants:
            wall, cpu, results[name] = fit(name)
            walls[name].append(wall)
            cpus[name].append(cpu)
    wall_s = {name: statistics.median(ts) for name, ts in walls.items()}
    cpu_s = {name: statistics.median(ts) for name, ts in cpus.items()}
    params = trainable_parameters(model)
    print(
        f"{cfg.model} at {h}x{w}, batch {cfg.batch_size}, {args.steps} steps, "
        f"{sum(p.numel() for p in params.values()) / 1e6:.1f} M trainable weights in "
        f"{len(params)} tensors, {args.threads} thread(s), median of {args.repeats}"
    )
    print(
        f"{'hook':13s} {'wall s':>7s} {'x fedavg':>8s} {'cpu s':>7s} {'x fedavg':>8s}  "
        "bit-identical to the loop"
    )
    for name in variants:
        same = ""
        if name != "fedavg" and not name.endswith("-ref"):
            same = _same(results[name], results[f"{name}-ref"])
        print(
            f"{name:13s} {wall_s[name]:7.3f} {wall_s[name] / wall_s['fedavg']:8.3f} "
            f"{cpu_s[name]:7.3f} {cpu_s[name] / cpu_s['fedavg']:8.3f}  {same}"
        )
    fused = [n for n in variants if n != "fedavg" and not n.endswith("-ref")]
    worst_wall = max(wall_s[n] / wall_s["fedavg"] for n in fused)
    worst_cpu = max(cpu_s[n] / cpu_s["fedavg"] for n in fused)
    print(
        f"fused: worst {worst_wall:.3f} x fedavg wall, {worst_cpu:.3f} x cpu "
        f"(target <= {TARGET:.2f})"
    )


if __name__ == "__main__":
    main()
