"""Federation overhead against local training per client and round, at a profile's sizes.

``fedepth bench`` reports the overhead of a whole run (results.json ``timing``); this script
explains it and extends it to profiles too long to run here. It measures, for one backbone:

- local training of one client round: ``LocalTrainer.fit`` on random frames at the profile's
  resolution and batch, timed at two step counts and fitted as ``setup + steps x per_step``,
  then evaluated at the profile's ``local_steps``;
- the server's work per client and round: the wire format of one update
  (:func:`fedepth.sim.wire_seconds`: encode, decode, finiteness check) and its share of a
  data-size weighted aggregate over ``--clients`` states (:func:`weighted_mean`);
- the one-time costs: one client's descriptor (the profile's descriptor frames through the
  frozen encoder + GeM) and the clustering of ``--clients`` descriptors (Jeffreys matrix +
  tau calibration + merge).

It then composes the overhead fractions the way the simulation counts them (clients train one
after another): per round ``(wire + aggregation) / (train + wire + aggregation)``, and for a
whole run the same with descriptors and clustering added once over the profile's rounds.
Every figure is a median of ``--repeats`` timed runs on one torch thread.

    python benchmarks/overhead.py [--profile small] [--backbone newcrfs-lite] [--clients 41]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from torch.utils.data import TensorDataset

from fedepth import clustering
from fedepth.bench import SIM_SIZES, sim_config
from fedepth.descriptor import DescriptorExtractor
from fedepth.models import get_state
from fedepth.sim import wire_seconds
from fedepth.strategies.aggregate import weighted_mean
from fedepth.training import LocalTrainer

TARGET = 0.02


def _median(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(profile: str, backbone: str, clients: int, repeats: int) -> dict[str, float]:
    cfg = sim_config("hpe", profile, model=backbone)
    h, w = cfg.image_size
    torch.manual_seed(0)
    model = cfg.build_model()
    n_frames = max(2 * cfg.batch_size, 8)
    rgb = torch.rand(n_frames, 3, h, w)
    depth = 1.0 + 20.0 * torch.rand(n_frames, 1, h, w)
    data = TensorDataset(rgb, depth)

    def fit(steps: int) -> Callable[[], object]:
        tc = replace(cfg.train_config(seed=0), num_steps=steps)
        return lambda: LocalTrainer(model, config=tc).fit(data)

    fit(1)()  # warm-up: allocator, kernels
    t1 = _median(fit(1), repeats)
    t3 = _median(fit(3), repeats)
    per_step = max((t3 - t1) / 2.0, 0.0)
    setup = max(t1 - per_step, 0.0)
    train = setup + per_step * cfg.local_steps

    state = get_state(model)
    rng = np.random.default_rng(0)
    states = [
        {
            k: v + rng.normal(0, 1e-3, v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in state.items()
        }
        for _ in range(clients)
    ]
    sizes = rng.integers(50, 500, clients)
    wire = _median(lambda: wire_seconds([], [[s] for s in states]), repeats) / clients
    agg = _median(lambda: weighted_mean(states, sizes), repeats) / clients

    extractor = DescriptorExtractor(
        model.forward_features, num_frames=cfg.descriptor_frames, seed=0
    )
    frames = [f for f in rgb] * (cfg.descriptor_frames // n_frames + 1)
    descriptor = _median(
        lambda: extractor.extract_with_features(frames, to_tensor=lambda t: t), repeats
    )
    dim = extractor.extract(frames[:2], to_tensor=lambda t: t).dim
    means = rng.normal(0, 1, (clients, dim))
    variances = np.exp(rng.normal(-2, 0.3, (clients, dim)))

    def cluster() -> None:
        clustering.calibrate(clustering.jeffreys_matrix(means, variances), 0.2)

    clustering_s = _median(cluster, repeats)

    server_round = wire + agg
    per_round = server_round / (train + server_round)
    rounds = cfg.rounds
    one_time = descriptor + clustering_s / clients  # per client
    run = (rounds * server_round + one_time) / (rounds * (train + server_round) + one_time)
    return {
        "profile": profile,
        "backbone": backbone,
        "image_size": f"{h}x{w}",
        "batch_size": cfg.batch_size,
        "local_steps": cfg.local_steps,
        "rounds": rounds,
        "clients": clients,
        "model_mib": sum(v.nbytes for v in state.values()) / 2**20,
        "train_step_s": per_step,
        "train_setup_s": setup,
        "train_round_s": train,
        "wire_s": wire,
        "aggregate_s": agg,
        "descriptor_s": descriptor,
        "clustering_s": clustering_s,
        "round_overhead_fraction": per_round,
        "run_overhead_fraction": run,
        "break_even_local_steps": float(
            np.ceil(max(server_round / TARGET - server_round - setup, 0.0) / max(per_step, 1e-9))
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(SIM_SIZES), default="small")
    parser.add_argument("--backbone", default="newcrfs-lite")
    parser.add_argument("--clients", type=int, default=41, help="fleet size (HPE small: 41)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    r = measure(args.profile, args.backbone, args.clients, args.repeats)
    if args.json:
        print(json.dumps(r))
        return
    print(
        f"{r['backbone']} at {r['image_size']}, batch {r['batch_size']}, "
        f"{r['local_steps']} local steps, {r['rounds']} rounds, {r['clients']} clients, "
        f"model {r['model_mib']:.1f} MiB\n"
        f"  local training / client / round  {r['train_round_s']:9.3f} s "
        f"({r['train_setup_s']:.3f} s set-up + {r['train_step_s']:.3f} s x steps)\n"
        f"  wire / client / round            {r['wire_s'] * 1e3:9.1f} ms\n"
        f"  aggregation / client / round     {r['aggregate_s'] * 1e3:9.1f} ms\n"
        f"  descriptor / client (once)       {r['descriptor_s']:9.3f} s\n"
        f"  clustering of the fleet (once)   {r['clustering_s']:9.3f} s\n"
        f"  per-round overhead               {r['round_overhead_fraction']:9.3%} "
        f"(target < {TARGET:.0%}; met from {r['break_even_local_steps']:.0f} local steps)\n"
        f"  whole-run overhead               {r['run_overhead_fraction']:9.3%}"
    )


if __name__ == "__main__":
    main()
