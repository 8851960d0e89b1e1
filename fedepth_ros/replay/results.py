"""A method's results in the benchmark's format (rounds, final metrics, clusters, the replay's
own measurements) from the coordinator's state, the robots' logs and the scorers' rows; and
results.json, report.md and the figures of the whole run."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.bench import FleetSummary, combine_seeds, render_report
from fedepth.bench.figures import write_figures
from fedepth.runstate import write_json_atomic, write_text_atomic
from fedepth.sim import (
    MethodRun,
    RoundRecord,
    config_dict,
    eval_indices,
    final_metrics,
    strategy_outputs,
)
from fedepth_coordinator.benchresults import load_final_strategy
from fedepth_coordinator.state import open_store
from fedepth_ros.replay.report import replay_report, write_replay_figures
from fedepth_ros.replay.spec import ReplaySpec
from fedepth_ros.replay.training import ReplayTraining, RobotState


class ReplayResults(ReplayTraining):
    """A method's summary; the run's results, report and figures."""

    def _summary(
        self,
        method: str,
        sdir: Path,
        robots: dict[str, RobotState],
        history: list[Any],
        scores: dict[str, dict[str, Any]],
        t_rounds: float,
        restarts: int,
    ) -> dict[str, Any]:
        c = self.config
        params = dict(c.method_params.get(method, {}))
        strategy, rounds_done = load_final_strategy(sdir / "coordinator", method, params)
        store = open_store("sqlite", sdir / "coordinator")
        try:
            snap = store.load()
        finally:
            store.close()
        records = {r.robot_id: r for r in snap.robots}
        losses = _losses(sdir / "logs", self.ids)
        rounds: list[RoundRecord] = []
        for h in history:
            per = [losses.get((rid, h.round)) for rid in self.ids]
            got = [x for x in per if x is not None]
            rounds.append(
                RoundRecord(
                    round=h.round,
                    train_seconds=float(h.duration_s),
                    aggregate_seconds=0.0,
                    wire_seconds=0.0,
                    mean_loss=float(np.mean(got)) if got else float("nan"),
                    download_bytes={rid: self.state_bytes for rid in self.ids},
                    upload_bytes={rid: self.state_bytes for rid in self.ids},
                )
            )
        test, routes, samples, replay_tests = self._test_metrics(scores)
        if rounds and test is not None:
            rounds[-1].test, rounds[-1].routes = test, routes
        final, groups, per_seq = final_metrics(rounds, c.last_rounds)
        clusters, out_params = strategy_outputs(strategy, params)
        run = MethodRun(
            method,
            rounds,
            final,
            per_seq,
            groups,
            clusters,
            0.0,
            0.0,
            samples,
            out_params,
            strategy,
        )
        summary = run.summary()
        summary["transport"] = "ros-replay"
        sent = {rid: r.entry.frames for rid, r in robots.items()}
        buffered = {rid: (records[rid].num_samples if rid in records else 0) for rid in self.ids}
        rss = [m for r in robots.values() for m in r.peak_rss if m]
        summary["replay"] = {
            "rounds_done": rounds_done,
            "rounds_wall_seconds": t_rounds,
            "round_wall_seconds": [float(h.duration_s) for h in history],
            "closed_by": [str(h.closed_by) for h in history],
            "max_robots": self.spec.max_robots,
            "lossless": self.spec.lossless,
            "robot_starts": {rid: r.starts for rid, r in robots.items()},
            "robot_restarts": restarts,
            "dropped": {rid: r.dropped_at for rid, r in robots.items() if r.dropped_at},
            "frames_sent": sent,
            "frames_buffered": buffered,
            "robot_peak_rss_bytes": {
                rid: max(r.peak_rss) if r.peak_rss else 0 for rid, r in robots.items()
            },
            "robot_peak_rss_bytes_max": max(rss) if rss else 0,
            "robot_peak_rss_bytes_mean": float(np.mean(rss)) if rss else 0.0,
            # cluster indices count the strategy's clients: the coordinator's order (sorted
            # ids), not necessarily the bags' order of self.ids
            "cluster_members": [
                [strategy.clients[i].cid for i in members] for members in clusters
            ],
            "tests": replay_tests,
        }
        arrays = {f"{k}/{j}": a for k, v in samples.items() for s in v for j, a in enumerate(s)}
        np.savez(sdir / "samples.npz", **arrays)  # type: ignore[arg-type]
        return summary

    def _test_metrics(
        self, scores: dict[str, dict[str, Any]]
    ) -> tuple[
        dict[str, dict[str, float]] | None,
        dict[str, list[int]],
        dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
        dict[str, Any],
    ]:
        """The last round's test metrics in the simulation's layout, from the scorers'
        rows: every published frame at its published size (``all``), and the benchmark's
        evaluation frames at the model's size (``bench_frames``, to compare with it)."""
        c = self.config
        per_seq: dict[str, dict[str, float]] = {}
        groups: dict[str, list[dict[str, float]]] = {}
        routes: dict[str, list[int]] = {}
        samples = {}
        replay: dict[str, Any] = {}
        bench_rows: dict[str, dict[str, float]] = {}
        for e in self.tests:
            res = scores.get(e.name)
            if res is None:
                replay[e.name] = {"missing": "not scored"}
                continue
            rows = [r for r in res["rows"] if r.get("native")]
            lat = [r["latency_s"] for r in res["rows"] if r.get("latency_s") is not None]
            at = set(eval_indices(res["frames_in_bag"], c.eval_frames))
            model_rows = [r["model"] for r in res["rows"] if r.get("model") and r["index"] in at]
            replay[e.name] = {
                "frames_sent": res["frames_in_bag"],
                "frames_seen_by_scorer": res["frames_seen"],
                "frames_answered": res["frames_answered"],
                "missing_stamps": res["missing_stamps"],
                "latency_s": lat,
                "route": res.get("route"),
            }
            if not rows:
                continue
            m = _mean_rows([r["native"] for r in rows])
            per_seq[e.name] = m
            if model_rows:
                bench_rows[e.name] = _mean_rows(model_rows)
            routes[e.name] = list(res.get("route") or [])
            pic = Path(str(res.get("npz", "")))
            if pic.is_file():
                with np.load(pic) as z:
                    samples[e.name] = [(z["rgb"], z["gt"], z["pred"])]
            groups.setdefault(f"platform:{res['platform']}", []).append(m)
            groups.setdefault(f"environment:{res['environment']}", []).append(m)
        if not per_seq:
            return None, routes, samples, replay
        out = {"all": _mean_rows(list(per_seq.values()))}
        out.update({g: _mean_rows(rows) for g, rows in groups.items()})
        out.update({f"seq:{k}": v for k, v in per_seq.items()})
        replay["bench_frames"] = {
            "all": _mean_rows(list(bench_rows.values())) if bench_rows else None,
            "per_sequence": bench_rows,
            "eval_frames": c.eval_frames,
            "size": list(c.image_size),
        }
        return out, routes, samples, replay

    def write(self, summaries: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        c = self.config
        methods = {m: combine_seeds({str(self.seed): summaries[m]}) for m in summaries}
        results = {
            "scenario": self.scenario,
            "profile": self.profile,
            "seed": self.seed,
            "seeds": {
                str(self.seed): {"data_dir": str(self.bag_dir), "weights": str(self.weights)}
            },
            "backbone": c.model,
            "data_dir": str(self.spec.scenario_dir or self.bag_dir),
            "weights": str(self.weights),
            "num_clients": len(self.clients),
            "num_test_sequences": len(self.tests),
            "transport": "ros-replay",
            "methods": methods,
            "overlap_sweep": {},
            "wall_seconds": time.perf_counter() - self.t0,
            "replay": {
                "bags": str(self.bag_dir),
                "max_robots": self.spec.max_robots,
                "lossless": self.spec.lossless,
                "missing": self.missing,
                "config": config_dict(c),
            },
        }
        write_json_atomic(
            self.out / "config.json", {"sim": config_dict(c), "spec": _spec(self.spec)}
        )
        write_json_atomic(self.out / "results.json", results)
        fleet = self._fleet_summary()
        pictures = {m: _load_samples(self.out / "state" / m / "samples.npz") for m in summaries}
        write_figures(self.out, fleet, {m: [summaries[m]] for m in summaries}, pictures)
        write_replay_figures(self.out, summaries)
        write_text_atomic(self.out / "report.md", render_report(results) + replay_report(results))
        return results

    def _fleet_summary(self) -> FleetSummary:
        """The robots' descriptors as the coordinator recorded them (the first method's)."""
        m = self.spec.methods[0]
        store = open_store("sqlite", self.out / "state" / m / "coordinator")
        try:
            recs = {r.robot_id: r for r in store.load().robots}
        finally:
            store.close()
        # in the coordinator's member order (sorted ids, coordstate.ready), the order the
        # strategies' cluster indices count in
        have = sorted(r for r in self.ids if r in recs and recs[r].descriptor is not None)
        descs = [recs[rid].descriptor for rid in have]
        return FleetSummary(
            data_dir=str(self.bag_dir),
            weights=str(self.weights),
            clients=[
                {
                    "name": rid,
                    "platform": recs[rid].labels.get("platform", ""),
                    "environment": recs[rid].labels.get("environment", ""),
                }
                for rid in have
            ],
            test=[e.name for e in self.tests],
            means=np.stack([d.mean for d in descs if d is not None]),
            variances=np.stack([d.var for d in descs if d is not None]),
        )


def _spec(spec: ReplaySpec) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.__dict__.items()}


def _mean_rows(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


_LOSS = re.compile(r"round (\d+): loss ([0-9.eE+-]+|nan); uploading")


def _losses(logs: Path, ids: Sequence[str]) -> dict[tuple[str, int], float]:
    """Each robot's training loss per round, from its log (the last attempt of a round)."""
    out: dict[tuple[str, int], float] = {}
    for rid in ids:
        path = logs / f"{rid}.robot.log"
        if not path.is_file():
            continue
        for m in _LOSS.finditer(path.read_text(encoding="utf-8", errors="replace")):
            out[(rid, int(m.group(1)))] = float(m.group(2))
    return out


def _load_samples(path: Path) -> dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    if not path.is_file():
        return {}
    out: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    with np.load(path) as z:
        names = sorted({k.rsplit("/", 1)[0] for k in z.files})
        for n in names:
            out[n] = [(z[f"{n}/0"], z[f"{n}/1"], z[f"{n}/2"])]
    return out
