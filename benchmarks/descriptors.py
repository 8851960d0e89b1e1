"""Whose encoder should the descriptor read? The clusters and routes of each reading, no training.

FeDepth describes a robot's data with "the frozen encoder of the pre-trained model". Two readings
of that (``--descriptor-encoder`` of ``fedepth bench``):

- ``model``: the encoder of the depth-pretrained initial checkpoint (what the robots do today);
- ``imagenet``: the frozen ImageNet encoder itself, untouched by depth pretraining (a robot can
  then describe its data before it downloads any model).

For every scenario and seed this script builds the fleet's descriptors under each reading, forms
FeDepth's soft clusters and hard clustering's partition with the benchmark's own rules (tau
calibrated for 20 % overlap on HPE, matched to PACFL's partition on BMR), and reports

- training side (what may choose the default): the share of a client's co-members (the other
  members of its clusters) that share its platform, its environment, and both (mean over
  clients); and a leave-one-out routing accuracy: each training client routed, by its
  descriptor, against the clusters formed without it, counted right when most members of the
  clusters it is routed to share its platform and environment;
- test side (reported, never used to choose): the same routing accuracy of the unseen test
  sequences.

    python benchmarks/descriptors.py --scenarios hpe,bmr --seeds 0,1,2 --out runs/descriptors

``--rules`` also evaluates FeDepth under other merge / routing rules (:mod:`fedepth.cluster_rules`;
tau calibrated on the map each merge rule makes), e.g. ``--readings model --rules
subsets/within-tau,duplicates/within-tau,cliques/within-tau,cliques/nearest``: the training-side
columns compare the rules before anything is trained.

Data and the initial checkpoints come from the benchmark's cache (generated and pretrained there
when missing, as ``fedepth bench --profile small`` would). Without arguments it runs on the smoke
profile (what ``make bench`` does, to check that the script still works).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedepth.bench import BenchSpec, sim_config
from fedepth.bench.inputs import ensure_data, ensure_weights
from fedepth.cluster_rules import check_merge, check_routing
from fedepth.composition import co_member_shares, member_shares
from fedepth.data.scenario import load_scenario
from fedepth.models.base import FeatureExtractor
from fedepth.sim import initial_model, prepare_fleet
from fedepth.sim.config import DESCRIPTOR_ENCODERS
from fedepth.strategies import ClientInfo, create_strategy

METHODS = ("fedepth", "hard")


def routed_right(
    clusters: Sequence[int], M: np.ndarray, labels: Sequence[dict[str, str]], own: dict[str, str]
) -> bool:
    """Whether most members of the routed clusters share ``own``'s platform and environment."""
    members = np.flatnonzero(M[list(clusters)].any(axis=0))
    both = member_shares(members, labels, own)["both"]
    return both is not None and both > 0.5


def clustered(method: str, params: dict[str, Any], infos: Sequence[ClientInfo]) -> Any:
    strategy = create_strategy(method, **params)
    strategy.initialize(list(infos), {"w": np.zeros(1, np.float32)})
    return strategy


def variants(rules: Sequence[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, method, extra params) of every evaluated variant: FeDepth and hard with the
    benchmark's rules, then FeDepth under each ``merge/routing`` pair of ``rules``."""
    out: list[tuple[str, str, dict[str, Any]]] = [(m, m, {}) for m in METHODS]
    for pair in rules:
        merge, _, routing = pair.partition("/")
        extra = {"merge": check_merge(merge), "routing": check_routing(routing or "within-tau")}
        out.append((f"fedepth[{merge}/{extra['routing']}]", "fedepth", extra))
    return out


def evaluate(
    fleet: Any, method_params: dict[str, Any], rules: Sequence[str] = ()
) -> dict[str, Any]:
    infos: list[ClientInfo] = fleet.infos
    labels = [dict(i.labels) for i in infos]
    out: dict[str, Any] = {}
    for name, method, extra in variants(rules):
        params = {**method_params.get(method, {}), **extra}
        strategy = clustered(method, params, infos)
        M = np.asarray(strategy.M_star, dtype=bool)
        loo = []
        for c, info in enumerate(infos):
            rest = [i for j, i in enumerate(infos) if j != c]
            s = clustered(method, params, rest)
            ks = s.route(info.descriptor, labels=info.labels, extra=info.extra).clusters
            loo.append(
                routed_right(
                    ks, np.asarray(s.M_star, bool), labels[:c] + labels[c + 1 :], labels[c]
                )
            )
        test = {}
        for seq, desc, extra in fleet.test_queries:
            own = {"platform": seq.meta.platform, "environment": seq.meta.environment}
            ks = strategy.route(desc, labels=own, extra=extra).clusters
            test[seq.name] = routed_right(ks, M, labels, own)
        out[name] = {
            "tau": float(getattr(strategy, "tau", float("nan")) or float("nan")),
            "clusters": int(M.shape[0]),
            "overlap": float((M.sum(axis=0) > 1).mean()),
            "co_members": co_member_shares(M, labels),
            "loo_routing": float(np.mean(loo)),
            "test_routing": float(np.mean(list(test.values()))),
            "test_routed_right": test,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="hpe")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--profile", default=None, help="default: small with --out, else smoke")
    ap.add_argument("--cache", default=".cache/fedepth")
    ap.add_argument("--out", default=None, help="folder for results.json (default: print only)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--readings",
        default=",".join(DESCRIPTOR_ENCODERS),
        help=f"descriptor readings to evaluate (default: {','.join(DESCRIPTOR_ENCODERS)})",
    )
    ap.add_argument(
        "--rules",
        default="",
        help="FeDepth merge/routing pairs to evaluate too, comma-separated "
        "(e.g. cliques/within-tau,duplicates/nearest)",
    )
    args = ap.parse_args(argv)
    readings = [r for r in args.readings.split(",") if r]
    rules = [r for r in args.rules.split(",") if r]
    unknown = sorted(set(readings) - set(DESCRIPTOR_ENCODERS))
    try:
        variants(rules)
    except ValueError as e:
        ap.error(str(e))
    if unknown:
        ap.error(
            f"unknown reading(s) {', '.join(unknown)}; known: {', '.join(DESCRIPTOR_ENCODERS)}"
        )
    torch.set_num_threads(args.threads)
    profile = args.profile or ("small" if args.out else "smoke")
    results: dict[str, Any] = {"profile": profile, "runs": {}}
    for scen in args.scenarios.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            cfg = sim_config(scen, profile, seed=seed)
            spec = BenchSpec(
                scenario=scen,
                profile=profile,
                methods=METHODS,
                out=Path("."),
                sim=cfg,
                cache_dir=Path(args.cache),
                progress=False,
            )
            scenario = load_scenario(ensure_data(spec, print))
            try:
                weights = ensure_weights(spec, scenario, print)
                model = initial_model(cfg, str(weights))
                for reading in readings:
                    t0 = time.perf_counter()
                    describer = (
                        FeatureExtractor.imagenet(model.encoder.name)
                        if reading == "imagenet"
                        else model
                    )
                    fleet = prepare_fleet(scenario, describer, cfg, progress=False)
                    params = {k: dict(v) for k, v in cfg.method_params.items()}
                    res = evaluate(fleet, params, rules)
                    results["runs"][f"{scen}/s{seed}/{reading}"] = res
                    for method, r in res.items():
                        cm = r["co_members"]
                        print(
                            f"{scen} seed {seed} {reading:<8} {method:<7} K={r['clusters']:>2} "
                            f"tau {r['tau']:.4g} "
                            f"overlap {r['overlap']:.2f}  co-members: platform "
                            f"{cm['platform']:.2f} env {cm['environment']:.2f} both "
                            f"{cm['both']:.2f}  LOO routing {r['loo_routing']:.2f}  "
                            f"test routing {r['test_routing']:.2f}  "
                            f"({time.perf_counter() - t0:.0f} s)",
                            flush=True,
                        )
            finally:
                scenario.close()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))
        print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
