"""Tests of the benchmark over several seeds, of resuming it, and of its command line."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedepth.bench import (
    ADDED_SETTINGS,
    BenchSpec,
    OutConflictError,
    beyond_spread,
    check_out,
    combine_seeds,
    render_report,
    run_benchmark,
    run_config,
    sim_config,
)
from fedepth.bench.figures import shown_methods, shown_sequences, write_curves
from fedepth.bench.fleet_summary import weights_sha256
from fedepth.bench.runner import _Bench
from fedepth.models import save_weights
from fedepth.models.base import DESCRIPTOR_LAYERS
from fedepth.runstate import load_finished
from fedepth.sim import TABLE_METRICS, RoundRecord, initial_model
from fedepth.transport import TransportError
from fedepth_cli.main import main

CFG = sim_config(
    "hpe",
    "smoke",
    model="regression-lite",
    rounds=3,
    local_steps=1,
    last_rounds=2,
    eval_frames=1,
    descriptor_frames=4,
)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Initial weights, so that these tests skip pretraining where it is not the point."""
    path = tmp_path_factory.mktemp("weights") / "w.safetensors"
    save_weights(initial_model(CFG), path)
    return path


def _untimed(value: Any) -> Any:
    """Results without what depends on the machine's speed."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in ("timing", "wall_seconds")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


# -- combining seeds and the report (no training) ---------------------------------------------
def _summary(abs_rel: float, *, groups: dict[str, float] | None = None) -> dict[str, Any]:
    metrics = {k: abs_rel * (i + 1) for i, k in enumerate(TABLE_METRICS)}
    return {
        **metrics,
        "final_all": {**metrics, "silog": 10 * abs_rel},
        "groups": {g: {"abs_rel": v} for g, v in (groups or {}).items()},
        "per_sequence": {"seq-a": {"abs_rel": abs_rel}},
        "clusters": [[0, 1]] if abs_rel > 0.15 else [[0], [1]],
        "params": {"tau": 1.5},
        "curves": {"round": [0, 1], "train_loss": [2.0, abs_rel], "abs_rel": [None, abs_rel]},
        "timing": {
            "train_seconds": 10 * abs_rel,
            **dict.fromkeys(("descriptor_seconds", "setup_seconds", "aggregate_seconds"), 0.1),
            **dict.fromkeys(("wire_seconds", "round_overhead_fraction", "overhead_fraction"), 0.1),
        },
        "bytes_per_round": {"download_mean": 4.0, "upload_mean": 2.0, "per_round": [{"d": 1}]},
        "routes": {"seq-a": [0]},
        "transport": "inprocess",
    }


def test_seeds_combine_into_mean_and_sample_std_with_every_seed_kept() -> None:
    per_seed = {
        "0": _summary(0.1, groups={"platform:spot": 1.0, "platform:car": 3.0}),
        "3": _summary(0.2, groups={"platform:spot": 2.0}),
    }
    e = combine_seeds(per_seed)
    assert e["abs_rel"] == pytest.approx(0.15)
    assert e["abs_rel_std"] == pytest.approx(0.1 / np.sqrt(2))  # ddof = 1
    assert e["d3_std"] == pytest.approx(0.7 / np.sqrt(2))
    assert list(e)[: 2 * len(TABLE_METRICS)] == [
        *TABLE_METRICS,
        *(f"{k}_std" for k in TABLE_METRICS),
    ]
    assert e["final_all"]["silog"] == pytest.approx(1.5)
    assert e["groups"]["platform:spot"] == pytest.approx(
        {"abs_rel": 1.5, "abs_rel_std": np.sqrt(0.5)}
    )
    # a group one seed lacks: over the seeds that have it
    assert e["groups"]["platform:car"] == {"abs_rel": 3.0, "abs_rel_std": 0.0}
    assert e["curves"]["train_loss"] == pytest.approx([2.0, 0.15])
    assert e["curves"]["abs_rel"][0] is None and e["curves"]["abs_rel"][1] == pytest.approx(0.15)
    assert e["timing"]["train_seconds"] == pytest.approx(1.5)
    assert e["bytes_per_round"]["per_round"] == [{"d": 1}]
    assert e["clusters"] == [[0], [1]]  # what has no mean: the first seed's
    assert e["seeds"] == per_seed and list(e["seeds"]) == ["0", "3"]


def test_one_seed_is_its_summary_plus_zero_spreads_and_the_seed() -> None:
    run = _summary(0.1, groups={"platform:spot": 1.0})
    e = combine_seeds({"7": run})
    assert e["seeds"] == {"7": run}
    for k in TABLE_METRICS:
        assert e[k] == run[k] and e[f"{k}_std"] == 0.0
    assert e["groups"] == {"platform:spot": {"abs_rel": 1.0, "abs_rel_std": 0.0}}
    plain = _without_spread({k: v for k, v in e.items() if k != "seeds"})
    assert plain == run and list(plain) == list(run)  # today's layout, key for key


def _without_spread(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_spread(v) for k, v in value.items() if not k.endswith("_std")}
    return value


def _results(methods: dict[str, list[float]]) -> dict[str, Any]:
    entries = {
        name: combine_seeds(
            {str(i): _summary(v, groups={"environment:forest": v}) for i, v in enumerate(values)}
        )
        for name, values in methods.items()
    }
    seeds = {str(i): {} for i in range(len(next(iter(methods.values()))))}
    return {
        "scenario": "hpe",
        "profile": "smoke",
        "seed": 0,
        "seeds": seeds,
        "backbone": "regression-lite",
        "num_clients": 4,
        "num_test_sequences": 2,
        "transport": "inprocess",
        "methods": entries,
        "overlap_sweep": {},
        "wall_seconds": 60.0,
    }


def test_the_report_marks_differences_from_fedepth_beyond_the_combined_spread() -> None:
    results = _results({"fedavg": [0.20, 0.22], "hard": [0.11, 0.13], "fedepth": [0.10, 0.12]})
    m = results["methods"]
    assert beyond_spread(m["fedavg"], m["fedepth"], "abs_rel")  # 0.10 apart, spread 0.028
    assert not beyond_spread(m["hard"], m["fedepth"], "abs_rel")  # 0.01 apart
    report = render_report(results)
    table_1 = report.split("## Table 1")[1].split("##")[0]
    rows = {line.split(" | ")[0]: line for line in table_1.splitlines() if line.startswith("| ")}
    assert "| 0.210 ± 0.014 * |" in rows["| fedavg"]
    assert "| 0.120 ± 0.014 |" in rows["| hard"] and "*" not in rows["| hard"]
    assert "*" not in rows["| fedepth"]
    assert "|mean_FeDepth - mean_method| > std_FeDepth + std_method" in report
    assert "sample standard deviation" in report and "seeds 0, 1" in report
    table_3a = report.split("## Table 3a")[1].split("##")[0]
    assert "| Hard clustering | 0.120 ± 0.014 |" in table_3a
    table_3c = report.split("## Table 3c")[1].split("##")[0]
    assert "| fedavg | 0.210 ± 0.014 * | 0.210 ± 0.014 * |" in table_3c
    assert "shaded ± one sample standard deviation" in report


def test_a_single_seed_report_has_plain_numbers_and_no_marks() -> None:
    results = _results({"fedavg": [0.2], "fedepth": [0.1]})
    report = render_report(results)
    assert "±" not in report.split("## Table 1")[1]
    assert "| fedavg | 0.200 | 0.400 |" in report
    assert "One seed: no spread is measured and no difference is marked" in report


def test_the_report_says_how_each_clustered_method_set_its_threshold() -> None:
    results = _results({"fedavg": [0.2], "fedepth": [0.1], "hard": [0.12], "pacfl": [0.11]})
    m = results["methods"]
    rule = "chosen so the clusters best reproduce PACFL's partition"
    m["fedepth"]["seeds"]["0"]["params"] = {"match": "pacfl", "tau": 684.0, "threshold_rule": rule}
    calibrated = "calibrated for 20% overlap"
    m["hard"]["seeds"]["0"]["params"] = {"tau": 1.5, "threshold_rule": calibrated}
    m["pacfl"]["seeds"]["0"]["params"] = {
        "threshold": 12.5,
        "threshold_rule": "PACFL's largest dendrogram gap",
    }
    m["fedavg"]["seeds"]["0"]["params"] = {}  # one cluster of everyone, no threshold
    lines = render_report(results).split("Cluster thresholds (the first seed's):")[1]
    assert (
        "- fedepth: threshold 684 (chosen so the clusters best reproduce PACFL's partition)"
        in lines
    )
    assert "- hard: threshold 1.5 (calibrated for 20% overlap), K = 2" in lines
    assert "- pacfl: threshold 12.5 degrees (PACFL's largest dendrogram gap)" in lines
    assert "- fedavg" not in lines.split("##")[0]


def test_the_report_sets_each_averaged_route_against_its_clusters_alone() -> None:
    results = _results({"fedavg": [0.2, 0.3], "fedepth": [0.1, 0.2]})
    assert "Averaged routes" not in render_report(results)  # no route averaged clusters
    seeds = results["methods"]["fedepth"]["seeds"]
    seeds["1"]["route_candidates"] = {
        "spot_forest_road": {
            "clusters": [3, 7],
            "averaged": {"abs_rel": 0.848},
            "alone": {
                "3": {"abs_rel": 0.349, "jeffreys": 12.5},
                "7": {"abs_rel": 1.2, "jeffreys": 9.0},
            },
        },
        "car_day": {
            "clusters": [1, 2],
            "averaged": {"abs_rel": 0.2},
            "alone": {"1": {"abs_rel": 0.25}, "2": {"abs_rel": 0.2}},  # recorded without S
        },
    }
    section = render_report(results).split("## Averaged routes against their clusters alone")[1]
    rows = [line for line in section.split("##")[0].splitlines() if line.startswith("| fedepth")]
    assert rows == [
        "| fedepth | 1 | spot_forest_road | 0.848 | 3: 0.349 (S 12.5), 7: 1.200 (S 9) | 0.349 "
        "| 7: 1.200 |",
        "| fedepth | 1 | car_day | 0.200 | 1: 0.250, 2: 0.200 | 0.200 | - |",
    ]
    assert "at least as good as its best candidate on 1 of 2 routes" in section
    assert "the nearest candidate was the best one on 0 of 1." in section


# -- the benchmark end to end -----------------------------------------------------------------
#: Methods whose server or client state must survive a restart: SCAFFOLD's control variates
#: (both sides), FedDyn's h and g_i, FedClust's clustering after round 0, FeDepth's soft
#: clusters and tau, CL's pooled participant; plus a point of the overlap sweep.
#: Each run is interrupted once, after the given round (2: its last, before its summary is
#: written).
STOP_AFTER = {"scaffold": 1, "feddyn": 0, "fedclust": 0, "fedepth": 2, "cl": 0, "sweep-0.5": 1}


class StopError(Exception):
    """Stands in for a killed process."""


@pytest.mark.slow
def test_an_interrupted_benchmark_resumes_to_the_numbers_of_an_uninterrupted_one(
    smoke_hpe: Path, weights: Path, tmp_path: Path
) -> None:
    spec = BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("scaffold", "feddyn", "fedclust", "fedepth", "cl"),
        out=tmp_path / "whole",
        sim=CFG,
        data_dir=smoke_hpe,
        cache_dir=tmp_path / "cache",
        weights=weights,
        sweep=(0.5,),
        progress=False,
    )
    whole = run_benchmark(spec, echo=lambda _: None)

    seen: dict[str, list[int]] = defaultdict(list)
    stopped: set[str] = set()

    def interrupt(name: str, seed: int, rec: RoundRecord) -> None:
        seen[name].append(rec.round)
        if name not in stopped and rec.round == STOP_AFTER[name]:
            stopped.add(name)
            raise StopError(name)

    out = tmp_path / "resumed"
    lines: list[str] = []
    for _attempt in range(len(STOP_AFTER) + 1):
        try:
            resumed = run_benchmark(replace(spec, out=out), echo=lines.append, on_round=interrupt)
            break
        except StopError:
            continue
    else:
        pytest.fail("the benchmark never finished")
    assert stopped == set(STOP_AFTER)
    # every round ran exactly once: resumed after the last checkpoint, finished runs not rerun
    assert dict(seen) == {name: [0, 1, 2] for name in STOP_AFTER}
    assert any("scaffold: seed 0 resumes after round 2 of 3" in line for line in lines)
    assert any("fedepth: seed 0 resumes after round 3 of 3" in line for line in lines)
    assert any("feddyn: seed 0 finished earlier" in line for line in lines)

    assert _untimed(resumed) == _untimed(whole)
    on_disk = [json.loads((d / "results.json").read_text()) for d in (out, spec.out)]
    assert _untimed(on_disk[0]) == _untimed(on_disk[1])
    assert resumed["methods"]["fedepth"]["abs_rel"] == whole["methods"]["fedepth"]["abs_rel"]
    for key in STOP_AFTER:  # the pictures of the report, too
        a = load_finished(out / "state" / "seed0" / key)
        b = load_finished(spec.out / "state" / "seed0" / key)
        assert a is not None and b is not None and a[1].keys() == b[1].keys()
        for seq, rows in a[1].items():
            for x, y in zip(rows[0], b[1][seq][0], strict=True):
                assert np.array_equal(x, y)
    assert not list(out.rglob("checkpoint"))  # a run's checkpoint goes once it finished
    assert (out / "report.md").is_file() and (out / "curves.png").stat().st_size > 1000


def _pretraining_spec(data: Path, tmp_path: Path, *, rounds: int) -> BenchSpec:
    """FedAvg on the smoke data, its initial model pretrained (2 steps) into a fresh cache."""
    return BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("fedavg",),
        out=tmp_path / "out",
        sim=replace(CFG, rounds=rounds, last_rounds=1, pretrain_steps=2, pretrain_batch=2),
        data_dir=data,
        cache_dir=tmp_path / "cache",
        progress=False,
    )


@pytest.mark.slow
def test_seeds_are_averaged_and_more_seeds_or_methods_run_only_the_missing_pairs(
    smoke_hpe: Path, tmp_path: Path
) -> None:
    spec = _pretraining_spec(smoke_hpe, tmp_path, rounds=2)
    cfg = spec.sim
    one = run_benchmark(spec, echo=lambda _: None)
    assert one["methods"]["fedavg"]["abs_rel_std"] == 0.0
    assert list(one["methods"]["fedavg"]["seeds"]) == ["0"] and list(one["seeds"]) == ["0"]

    ran: list[tuple[str, int]] = []
    more = run_benchmark(
        replace(spec, methods=("fedavg", "fedprox"), seeds=(0, 1)),
        echo=lambda _: None,
        on_round=lambda name, seed, rec: ran.append((name, seed)),
    )
    assert sorted(set(ran)) == [("fedavg", 1), ("fedprox", 0), ("fedprox", 1)]
    e = more["methods"]["fedavg"]
    assert e["seeds"]["0"] == one["methods"]["fedavg"]["seeds"]["0"]  # loaded, timing and all
    s0, s1 = e["seeds"]["0"], e["seeds"]["1"]
    assert s0["abs_rel"] != s1["abs_rel"]  # each seed pretrains and trains anew
    for k in TABLE_METRICS:
        assert e[k] == pytest.approx((s0[k] + s1[k]) / 2)
        assert e[f"{k}_std"] == pytest.approx(abs(s0[k] - s1[k]) / np.sqrt(2))
    assert len(list((tmp_path / "cache" / "pretrain").glob("*-s1-*.safetensors"))) == 1
    assert list(more["seeds"]) == ["0", "1"] and more["seed"] == 0
    config = json.loads((spec.out / "config.json").read_text())
    assert config["seeds"] == [0, 1] and config["methods"] == ["fedavg", "fedprox"]
    assert "seeds 0, 1" in (spec.out / "report.md").read_text()

    # seed 1 of the pair is the run a single-seed benchmark with seed 1 makes
    alone = run_benchmark(replace(spec, out=tmp_path / "alone", seeds=(1,)), echo=lambda _: None)
    assert _untimed(alone["methods"]["fedavg"]["seeds"]["1"]) == _untimed(s1)

    # the training settings must match to add to a run; start over with fresh
    with pytest.raises(OutConflictError, match="rounds=2; this command has rounds=3"):
        run_benchmark(replace(spec, sim=replace(cfg, rounds=3)), echo=lambda _: None)
    fresh = run_benchmark(replace(spec, fresh=True, seeds=(1,)), echo=lambda _: None)
    assert list(fresh["methods"]["fedavg"]["seeds"]) == ["1"]
    assert not (spec.out / "state" / "seed0").exists()


def test_each_seed_records_its_checkpoint_and_a_seed_started_elsewhere_is_not_added_to(
    smoke_hpe: Path, tmp_path: Path
) -> None:
    import torch

    spec = _pretraining_spec(smoke_hpe, tmp_path, rounds=1)
    cfg = spec.sim
    one = run_benchmark(spec, echo=lambda _: None)
    (cached,) = (tmp_path / "cache" / "pretrain").glob("*.safetensors")
    start = one["seeds"]["0"]
    assert start["weights"] == str(cached)
    assert start["weights_sha256"] == weights_sha256(cached)
    assert start["machine"]["torch"] == torch.__version__ and start["machine"]["cores"] >= 1
    assert start["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"seed 0 `{start['weights_sha256'][:12]}`" in (spec.out / "report.md").read_text()

    # a seed recorded when the digest was of the file's bytes: the same file still matches
    fleet_json = spec.out / "state" / "seed0" / "fleet.json"
    recorded = fleet_json.read_text()
    head = json.loads(recorded)
    head["weights_sha256"] = hashlib.sha256(cached.read_bytes()).hexdigest()
    fleet_json.write_text(json.dumps(head))
    _Bench(spec, lambda _: None, None).check_same_start(0, cached, weights_sha256(cached))
    fleet_json.write_text(recorded)

    # the cached checkpoint pretrained again elsewhere (here: replaced by another model)
    save_weights(initial_model(replace(cfg, seed=7)), cached)
    other = weights_sha256(cached)
    more = replace(spec, methods=("fedavg", "fedprox"))
    with pytest.raises(
        OutConflictError,
        match=rf"seed 0's runs \(fedavg\) started from a checkpoint with SHA-256 "
        rf"{start['weights_sha256'][:12]}, pretrained on .+; {cached} has {other[:12]} here",
    ):
        run_benchmark(more, echo=lambda _: None)
    assert not (spec.out / "state" / "seed0" / "fedprox").exists()
    # what is finished still loads without a check (nothing is added), --fresh starts over
    again = run_benchmark(spec, echo=lambda _: None)
    assert again["seeds"]["0"]["weights_sha256"] == start["weights_sha256"]
    fresh = run_benchmark(replace(more, fresh=True), echo=lambda _: None)
    assert fresh["seeds"]["0"]["weights_sha256"] == other
    assert set(fresh["methods"]) == {"fedavg", "fedprox"}


def _bench_cli(out: Path, data: Path, weights: Path, *extra: str) -> int:
    return main(
        [
            "bench",
            "--scenario",
            "hpe",
            "--profile",
            "smoke",
            "--data",
            str(data),
            "--weights",
            str(weights),
            "--methods",
            "fedavg",
            "--backbone",
            "regression-lite",
            "--local-steps",
            "1",
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
    )


def test_bench_cli_resumes_refuses_other_settings_and_starts_over_with_fresh(
    smoke_hpe: Path, weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert _bench_cli(out, smoke_hpe, weights, "--rounds", "1") == 0
    first = json.loads((out / "results.json").read_text())
    # --quiet: no bars, but a log line per round, with the test Abs Rel the run recorded
    logged = [line for line in capsys.readouterr().err.splitlines() if " round " in line]
    curve = first["methods"]["fedavg"]["curves"]
    assert logged == [
        f"fedavg seed 0 round 1/1: loss {curve['train_loss'][0]:.3f}, test abs_rel "
        f"{curve['abs_rel'][0]:.3f}, training {logged[0].rsplit(' ', 2)[1]} s"
    ]

    assert _bench_cli(out, smoke_hpe, weights, "--rounds", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err == (
        f"fedepth bench: error: {out} holds a run with rounds=1; this command has rounds=2; "
        "use another --out, or --fresh to start over\n"
    )

    assert _bench_cli(out, smoke_hpe, weights, "--rounds", "1") == 0  # nothing left to run
    assert "fedavg: seed 0 finished earlier" in capsys.readouterr().err
    again = json.loads((out / "results.json").read_text())
    assert _untimed(again) == _untimed(first)

    assert _bench_cli(out, smoke_hpe, weights, "--rounds", "2", "--fresh") == 0
    assert json.loads((out / "config.json").read_text())["sim"]["rounds"] == 2
    assert (
        len(json.loads((out / "results.json").read_text())["methods"]["fedavg"]["curves"]["round"])
        == 2
    )


def test_bench_cli_interrupted_says_what_is_kept_and_resumes(
    smoke_hpe: Path,
    weights: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fedepth.bench

    out = tmp_path / "run"
    real = fedepth.bench.run_benchmark

    def stopped_after_a_round(spec: BenchSpec, **kwargs: Any) -> dict[str, Any]:
        def ctrl_c(name: str, seed: int, rec: RoundRecord) -> None:
            raise KeyboardInterrupt

        return real(spec, **{**kwargs, "on_round": ctrl_c})

    monkeypatch.setattr(fedepth.bench, "run_benchmark", stopped_after_a_round)
    assert _bench_cli(out, smoke_hpe, weights, "--rounds", "2") == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"interrupted: the finished runs and rounds are kept in {out / 'state'}; "
        "the same command continues from there"
    )
    monkeypatch.setattr(fedepth.bench, "run_benchmark", real)
    assert _bench_cli(out, smoke_hpe, weights, "--rounds", "2") == 0
    assert "fedavg: seed 0 resumes after round 1 of 2" in capsys.readouterr().err


def _one_round_fleet(out: Path, data: Path, weights: Path, **sim: Any) -> tuple[BenchSpec, Any]:
    """One FedAvg round of CFG with ``sim`` changed, into ``out``: its spec and the fleet
    summary (descriptors) it recorded."""
    from fedepth.bench import FleetSummary

    spec = BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("fedavg",),
        out=out,
        sim=replace(CFG, rounds=1, last_rounds=1, **sim),
        data_dir=data,
        weights=weights,
        progress=False,
    )
    run_benchmark(spec, echo=lambda _: None)
    fleet = FleetSummary.load(out / "state" / "seed0")
    assert fleet is not None
    return spec, fleet


def test_the_descriptor_pools_the_shallow_maps_unless_told_and_an_older_out_does_not_resume(
    smoke_hpe: Path, weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedepth_cli.main import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    (action,) = [a for a in bench._actions if a.dest == "descriptor_layers"]
    assert tuple(action.choices or ()) == DESCRIPTOR_LAYERS

    model = CFG.build_model()
    dims = {}
    for layers in DESCRIPTOR_LAYERS:
        spec, fleet = _one_round_fleet(
            tmp_path / layers, smoke_hpe, weights, descriptor_layers=layers
        )
        dims[layers] = fleet.means.shape[1]
    channels = model.encoder.channels
    assert dims == {"shallow": sum(channels[:3]), "deepest": channels[-1]}

    # a run recorded before the setting existed pooled the deepest map: it resumes as that,
    # and is refused with the default, naming the setting
    config = json.loads((tmp_path / "deepest" / "config.json").read_text())
    del config["sim"]["descriptor_layers"]
    (tmp_path / "deepest" / "config.json").write_text(json.dumps(config))
    check_out(spec)  # the loop's last spec: deepest, on tmp_path / "deepest"
    with pytest.raises(
        OutConflictError, match="descriptor_layers=deepest; this command has descriptor_layers"
    ):
        check_out(replace(spec, sim=replace(spec.sim, descriptor_layers="shallow")))

    # the robots of the gRPC transport describe with the default maps only
    args = ("--descriptor-layers", "deepest", "--transport", "grpc", "--executor", "sequential")
    assert _bench_cli(tmp_path / "grpc", smoke_hpe, weights, *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use the in-process transport" in err


def test_the_imagenet_descriptor_reads_the_frozen_imagenet_encoder_not_the_checkpoint(
    smoke_hpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    # an initial checkpoint whose encoder moved away from ImageNet's (as pretraining moves it)
    trained = initial_model(CFG)
    with torch.no_grad():
        for p in trained.encoder.parameters():
            p.mul_(1.5)
    weights = tmp_path / "moved.safetensors"
    save_weights(trained, weights)
    means = {}
    for reading in ("model", "imagenet"):
        _, fleet = _one_round_fleet(
            tmp_path / reading, smoke_hpe, weights, descriptor_encoder=reading
        )
        means[reading] = fleet.means
    # the descriptor of the first client under the ImageNet encoder alone, computed here
    from fedepth.data.scenario import load_scenario
    from fedepth.models.base import FeatureExtractor
    from fedepth.sim import prepare_fleet

    scenario = load_scenario(smoke_hpe)
    try:
        sim = replace(CFG, descriptor_encoder="imagenet")
        imagenet = FeatureExtractor.imagenet("mobilenet_v2")
        own = prepare_fleet(scenario, imagenet, sim, progress=False)
    finally:
        scenario.close()
    first = own.infos[0].descriptor
    assert first is not None
    np.testing.assert_allclose(means["imagenet"][0], first.mean, rtol=1e-6)
    assert not np.allclose(means["imagenet"], means["model"])
    # the robots of the gRPC transport describe with the served model's encoder
    args = ("--descriptor-encoder", "imagenet", "--transport", "grpc", "--executor", "sequential")
    assert _bench_cli(tmp_path / "grpc", smoke_hpe, weights, *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use the in-process transport" in err


def test_an_out_with_unreadable_or_missing_settings_is_refused(tmp_path: Path) -> None:
    spec = BenchSpec("hpe", "smoke", ("fedavg",), tmp_path / "out", CFG, progress=False)
    check_out(spec)  # nothing there yet
    (spec.out / "state").mkdir(parents=True)
    with pytest.raises(OutConflictError, match=r"no config\.json to check them against"):
        check_out(spec)
    (spec.out / "config.json").write_text("{not json")
    with pytest.raises(OutConflictError, match=r"config\.json that cannot be read"):
        check_out(spec)
    (spec.out / "config.json").write_text(json.dumps(run_config(spec)))
    check_out(spec)
    check_out(replace(spec, methods=("fedavg", "pacfl"), sweep=(0.2,), seeds=(0, 4)))
    with pytest.raises(OutConflictError, match="holds a run with backbone=regression-lite, "):
        check_out(replace(spec, sim=replace(CFG, model="adabins-lite", lr=1e-3)))
    with pytest.raises(OutConflictError, match="this command has transport=grpc"):
        check_out(replace(spec, transport="grpc"))
    # a run recorded before the settings added since existed resumes at what it did then (the
    # settings' before-values), and only there, named with that value
    old = run_config(spec)
    for key in ADDED_SETTINGS:
        del old["sim"][key]
    (spec.out / "config.json").write_text(json.dumps(old))
    before = replace(CFG, **ADDED_SETTINGS)
    check_out(replace(spec, sim=before))
    with pytest.raises(OutConflictError, match=r"round_schedule=constant; this command has "):
        check_out(replace(spec, sim=replace(before, round_schedule="cosine")))
    with pytest.raises(OutConflictError, match="descriptor_layers=deepest; this command has"):
        check_out(spec)  # the default descriptor is not the one of runs recorded before it


def test_a_transport_other_than_in_process_must_be_handed_to_the_library(
    tmp_path: Path,
) -> None:
    """fedepth runs methods in-process only; the gRPC transport comes from its caller."""
    spec = BenchSpec("hpe", "smoke", ("fedavg",), tmp_path / "out", CFG, transport="grpc")
    with pytest.raises(TransportError, match=r"transport='grpc' needs a transport.*GrpcBench"):
        run_benchmark(spec)
    assert not spec.out.exists()  # refused before anything is written

    def unused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called")

    inprocess = replace(spec, transport="inprocess")
    with pytest.raises(TransportError, match="a transport was passed for"):
        run_benchmark(inprocess, transport=unused)
    assert not spec.out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", ""], "--seeds is empty; give comma-separated integers >= 0, e.g. 0,1,2"),
        (["--seeds", " , "], "--seeds is empty"),
        (["--seeds", "0,a"], "--seeds 0,a: 'a' is not an integer"),
        (["--seeds", "0,1.5"], "'1.5' is not an integer"),
        (["--seeds=0,-1"], "--seeds 0,-1: -1 is negative; seeds must be >= 0"),
        (["--seeds", "1,2,1"], "--seeds 1,2,1: 1 is given twice"),
        (["--seed", "0", "--seeds", "1,2"], "give --seed S (one seed) or --seeds LIST"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
    ],
)
def test_bench_cli_refuses_bad_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    code = main(["bench", "--scenario", "hpe", "--profile", "smoke", "--out", str(out), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("fedepth bench: error:")
    assert not out.exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rounds", "0"], "argument --rounds: 0 must be >= 1"),
        (["--rounds", "-3"], "argument --rounds: -3 must be >= 1"),
        (["--local-steps", "0"], "argument --local-steps: 0 must be >= 1"),
        (["--pretrain-steps", "ten"], "argument --pretrain-steps: 'ten' is not an integer"),
        (["--lr", "0"], "argument --lr: 0 must be a finite number > 0"),
        (["--lr", "nan"], "argument --lr: nan must be a finite number > 0"),
        (["--lr", "fast"], "argument --lr: 'fast' is not a number"),
    ],
)
def test_bench_cli_refuses_counts_below_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    # before: --rounds 0 generated and pretrained, then failed with a KeyError traceback
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--scenario", "hpe", "--profile", "smoke", "--out", str(out), *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_bench_help_documents_seeds_and_resuming(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--seeds LIST" in text and "--fresh" in text
    assert "continues where it stopped" in text and "restarts from round 0" in text


def test_curve_change_uses_the_last_evaluated_rounds() -> None:
    from fedepth.bench import curve_change

    assert curve_change([None, 1.0, None, 0.8, 0.6, 0.55, 0.5, 0.5], rounds=5) == (
        0.8,
        0.5,
        pytest.approx(-0.375),
    )
    assert curve_change([None, 0.4]) is None


def test_predictions_show_sequences_from_every_part_of_the_test_set() -> None:
    rooms = [f"nyu_test_{i}" for i in range(8)]
    drives = [f"kitti_test_{i}" for i in range(4)]
    shown = shown_sequences([*rooms, *drives])
    assert shown == [*(rooms[i] for i in (0, 2, 4, 7)), drives[1], drives[3]]
    assert shown_sequences(rooms[:3]) == rooms[:3]


def test_predictions_always_show_fedepth() -> None:
    table = ["cl", "fedavg", "pacfl", "hard", "fedepth", "fedepth@20%"]
    assert shown_methods(table) == ["cl", "fedavg", "pacfl", "fedepth"]
    assert shown_methods(["fedavg", "fedepth"]) == ["fedavg", "fedepth"]
    assert shown_methods(["cl", "fedavg", "pacfl", "hard", "fedprox"]) == table[:4]


def test_curves_show_each_methods_seed_mean_with_its_band_and_a_legend_beside_the_axes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.figure

    saved: list[Any] = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig)
    )

    def seed(loss: list[float], err: list[float | None]) -> dict[str, Any]:
        return {"curves": {"round": [0, 1, 2], "train_loss": loss, "abs_rel": err}}

    runs = {
        "fedavg": [
            seed([3.0, 2.0, 1.0], [None, 0.6, 0.4]),
            seed([5.0, 4.0, 3.0], [None, 0.8, 0.6]),
        ],
        "fedepth": [seed([2.0, 1.0, 0.5], [None, 0.3, 0.2])],
    }
    write_curves(tmp_path, runs)

    (fig,) = saved
    loss_ax, err_ax = fig.axes
    assert [line.get_label() for line in err_ax.get_lines()] == ["fedavg", "fedepth"]
    fedavg_err = err_ax.get_lines()[0]
    assert fedavg_err.get_xdata().tolist() == [
        2,
        3,
    ]  # rounds counted from 1, unscored round left out
    assert fedavg_err.get_ydata() == pytest.approx([0.7, 0.5])
    assert loss_ax.get_lines()[0].get_ydata() == pytest.approx([4.0, 3.0, 2.0])
    # a band (1 sample std) for the method with two seeds only, on both axes
    assert len(loss_ax.collections) == len(err_ax.collections) == 1
    lower = err_ax.collections[0].get_paths()[0].vertices[:, 1].min()
    assert lower == pytest.approx(0.5 - np.std([0.4, 0.6], ddof=1))
    assert err_ax.get_title().endswith("mean of 2 seeds ± 1 std")
    legend = err_ax.get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().x0 > err_ax.get_window_extent().x1


def _reorder_metadata(src: Path, dst: Path) -> None:
    """``src`` rewritten with its header's metadata keys in reverse order (same tensors)."""
    raw = src.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"] = dict(reversed(list(header["__metadata__"].items())))
    text = json.dumps(header, separators=(",", ":")).encode()
    dst.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])


def test_the_checkpoint_digest_is_of_the_weights_not_of_the_file_bytes(tmp_path: Path) -> None:
    # safetensors writes the metadata in an order that changes between saves: the same
    # weights pretrained twice gave files that differ only there
    cfg = sim_config("hpe", "smoke")
    model = initial_model(cfg)
    a, b, c = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.safetensors"
    save_weights(model, a)
    _reorder_metadata(a, b)
    assert a.read_bytes() != b.read_bytes()
    assert weights_sha256(a) == weights_sha256(b)
    with torch.no_grad():
        first = next(model.parameters())
        first[(0,) * first.ndim] += 1e-3
    save_weights(model, c)
    assert weights_sha256(c) != weights_sha256(a)


def test_an_out_that_recorded_a_users_weights_by_the_file_hash_resumes_with_that_file(
    tmp_path: Path,
) -> None:
    # runs recorded before the weights digest existed named `--weights` by the file's SHA-256
    cfg = sim_config("hpe", "smoke")
    model = initial_model(cfg)
    path = tmp_path / "start.safetensors"
    save_weights(model, path)
    spec = BenchSpec("hpe", "smoke", ("fedavg",), tmp_path / "out", cfg, weights=path)
    old = run_config(spec)
    old["inputs"]["weights_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    spec.out.mkdir()
    (spec.out / "config.json").write_text(json.dumps(old))
    check_out(spec)  # the same file: the same start
    with torch.no_grad():
        first = next(model.parameters())
        first[(0,) * first.ndim] += 1e-3
    save_weights(model, path)
    with pytest.raises(OutConflictError, match="holds a run with weights_sha256="):
        check_out(spec)  # other weights at the same path


def test_the_local_learning_rate_from_the_command_line_is_recorded_and_used(
    smoke_hpe: Path, weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ("--rounds", "2")
    out = tmp_path / "lr"
    assert _bench_cli(out, smoke_hpe, weights, *base, "--lr", "3e-3") == 0
    assert json.loads((out / "config.json").read_text())["sim"]["lr"] == 3e-3
    assert _bench_cli(tmp_path / "default", smoke_hpe, weights, *base) == 0
    losses = [
        json.loads((d / "state" / "seed0" / "fedavg" / "summary.json").read_text())["curves"]
        for d in (out, tmp_path / "default")
    ]
    assert losses[0]["train_loss"] != losses[1]["train_loss"]  # the clients trained with it
    capsys.readouterr()
    # an --out resumes only with the learning rate it was run with
    assert _bench_cli(out, smoke_hpe, weights, *base) == 2
    assert "holds a run with lr=0.003" in capsys.readouterr().err


def test_strategy_parameters_from_the_command_line_are_checked_recorded_and_used(
    smoke_hpe: Path, weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    for bad, message in [
        ("fedavg.alpha", "give METHOD.KEY=VALUE"),
        ("=1", "give METHOD.KEY=VALUE"),
        ("feddyn.alpha=0.1", "feddyn is not run (--methods fedavg,cl,scaffold)"),
        ("fedavg.alpha=0.1", "fedavg has no parameter alpha; its parameters: server_lr, server_"),
        ("scaffold.server_lr=0.5", "scaffold has no parameter server_lr; its parameters: eta_g"),
        ("cl.lr=-1", "cl: lr must be a number > 0, got -1"),
        ("cl.round_schedule=step", "cl: unknown round_schedule 'step'"),
    ]:
        args = ("--methods", "fedavg,cl,scaffold", "--method-param", bad)
        assert _bench_cli(out, smoke_hpe, weights, *args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not out.exists()  # refused before anything is written
    # a parameter that conflicts with the scenario's names it (BMR: FeDepth's tau matches PACFL)
    bmr = ["bench", "--scenario", "bmr", "--profile", "smoke", "--methods", "fedepth"]
    assert main([*bmr, "--method-param", "fedepth.tau=0.3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        "give tau or match, not both" in err
        and 'the scenario sets fedepth {"match": "pacfl"}' in err
    )
    assert not out.exists()

    base = ("--methods", "cl", "--rounds", "2")
    own = (*base, "--method-param", "cl.lr=0.01", "--method-param", "cl.round_schedule=cosine")
    assert _bench_cli(out, smoke_hpe, weights, *own) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["sim"]["method_params"]["cl"] == {"lr": 0.01, "round_schedule": "cosine"}
    assert _bench_cli(tmp_path / "default", smoke_hpe, weights, *base) == 0
    losses = [
        json.loads((d / "state" / "seed0" / "cl" / "summary.json").read_text())["curves"]
        for d in (out, tmp_path / "default")
    ]
    assert losses[0]["train_loss"] != losses[1]["train_loss"]  # CL trained with its own lr
    report = (out / "report.md").read_text()
    assert 'Strategy parameters: cl `lr=0.01`, `round_schedule="cosine"`.' in report
    assert "Strategy parameters" not in (tmp_path / "default" / "report.md").read_text()
    capsys.readouterr()
    # an --out resumes only with the parameters it was run with
    assert _bench_cli(out, smoke_hpe, weights, *own) == 0
    assert _bench_cli(out, smoke_hpe, weights, *base) == 2
    assert "holds a run with method_params=" in capsys.readouterr().err


def test_the_small_profile_gives_bmr_twice_the_rounds_of_hpe_and_nothing_else() -> None:
    hpe, bmr = sim_config("hpe", "small"), sim_config("bmr", "small")
    assert bmr.rounds == 2 * hpe.rounds
    # besides the rounds, BMR differs only by its threshold rule
    assert replace(bmr, rounds=hpe.rounds, method_params={}) == replace(hpe, method_params={})
    assert sim_config("bmr", "small", rounds=8).rounds == 8  # the command line still decides
    assert sim_config("bmr", "smoke").rounds == sim_config("hpe", "smoke").rounds


def test_the_rounds_help_names_the_small_profiles_round_counts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the help is a literal (building the parser must not import torch), so it is checked here
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    hpe, bmr = sim_config("hpe", "small").rounds, sim_config("bmr", "small").rounds
    assert f"small: {hpe} on HPE, {bmr} on BMR" in shown
