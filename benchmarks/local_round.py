"""How much one client's local round moves a model: train single clients for one round from
the pretrained checkpoint and score the result on the unseen test sequences of the client's
own platform and environment (what FeDepth serves a singleton cluster's robots), against the
pretrained model itself.

    python benchmarks/local_round.py --data .cache/fedepth/data/hpe-small-s0-g2 \
        --weights .cache/fedepth/pretrain/<checkpoint>.safetensors --lrs 5e-4,1e-4 \
        --optimizers adamw,sgd

Prints one line per (client, optimizer, lr): the mean Abs Rel on the matching test sequences
before and after the round. Runs on one torch thread.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedepth.bench import sim_config
from fedepth.data.scenario import load_scenario
from fedepth.models.state import load_weights
from fedepth.sim import ClientJob, evaluate_sequence, run_job
from fedepth.strategies.base import TrainTask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--lrs", default="5e-4,1e-4")
    ap.add_argument("--optimizers", default="adamw")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--clients", type=int, default=6, help="clients spread over the fleet")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sc = load_scenario(args.data)
    base = sim_config("hpe", "small", seed=0, local_steps=args.steps)
    model = base.build_model()
    load_weights(model, args.weights)
    init = {k: v.detach().clone().numpy() for k, v in model.state_dict().items()}
    spread = np.linspace(0, len(sc.clients) - 1, args.clients).round().astype(int)
    picks = [sc.clients[i] for i in spread]
    for client in picks:
        tests = [
            s
            for s in sc.test
            if s.meta.platform == client.platform and s.meta.environment == client.environment
        ] or sc.test
        model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
        before = np.mean([evaluate_sequence(model, s, base)[0]["abs_rel"] for s in tests])
        for opt in args.optimizers.split(","):
            for lr in (float(x) for x in args.lrs.split(",")):
                cfg = sim_config(
                    "hpe", "small", seed=0, local_steps=args.steps, lr=lr, optimizer=opt
                )
                task = TrainTask(state=init, recipe=cfg.recipe(0))
                t0 = time.perf_counter()
                run_job(cfg, ClientJob(client.name, client.sequences, task, {}, rnd=0), model)
                after = np.mean([evaluate_sequence(model, s, cfg)[0]["abs_rel"] for s in tests])
                print(
                    f"{client.name:40s} {opt:6s} lr {lr:7.1e}: abs_rel {before:.3f} -> "
                    f"{after:.3f} ({len(tests)} test seq, {time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
