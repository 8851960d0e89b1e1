"""Tests of the in-process federation and the benchmark on the smoke scenarios."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedepth.bench import BenchSpec, ensure_weights, run_benchmark, sim_config
from fedepth.data.crops import evaluation_crop
from fedepth.data.scenario import Scenario, load_scenario
from fedepth.data.torchdata import resize_frame
from fedepth.metrics import compute_errors, mean_errors
from fedepth.models import get_state, set_state
from fedepth.sim import (
    ClientJob,
    Fleet,
    JobResult,
    SequentialExecutor,
    SimConfig,
    Simulation,
    distinct_payloads,
    eval_indices,
    evaluate_sequence,
    initial_model,
    prepare_fleet,
    pretrain,
    state_nbytes,
    wire_seconds,
)
from fedepth.sim.simulation import pooled_recipe
from fedepth.strategies import (
    ClusteredStrategy,
    FeDepth,
    RouteDecision,
    Strategy,
    create_strategy,
)
from fedepth.strategies.fedavg import FedAvg
from fedepth_cli.main import main

CFG = sim_config(
    "hpe",
    "smoke",
    model="regression-lite",
    rounds=2,
    local_steps=1,
    last_rounds=1,
    eval_frames=1,
    descriptor_frames=4,
)


@pytest.fixture(scope="module")
def scenario(smoke_hpe: Path) -> Iterator[Scenario]:
    sc = load_scenario(smoke_hpe)
    yield sc
    sc.close()


@pytest.fixture(scope="module")
def fleet(scenario: Scenario) -> Fleet:
    return prepare_fleet(scenario, initial_model(CFG), CFG, progress=False)


def _sim(fleet: Fleet, config: SimConfig = CFG) -> Simulation:
    return Simulation(fleet, get_state(initial_model(config)), config, SequentialExecutor())


def _states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_runs_are_deterministic_per_seed(scenario: Scenario, fleet: Fleet) -> None:
    r1 = _sim(fleet).run("fedavg", progress=False)
    r2 = _sim(fleet).run("fedavg", progress=False)
    assert r1.final == r2.final
    assert _states_equal(
        r1.strategy.model_for(scenario.clients[0].name),
        r2.strategy.model_for(scenario.clients[0].name),
    )
    other = _sim(fleet, replace(CFG, seed=1)).run("fedavg", progress=False)
    assert not _states_equal(
        other.strategy.model_for(scenario.clients[0].name),
        r1.strategy.model_for(scenario.clients[0].name),
    )


def test_fedepth_with_one_cluster_equals_fedavg_end_to_end(
    scenario: Scenario, fleet: Fleet
) -> None:
    cfg = replace(CFG, method_params={"fedepth": {"tau": float("inf")}})
    sim = _sim(fleet, cfg)
    soft, avg = sim.run("fedepth", progress=False), sim.run("fedavg", progress=False)
    assert soft.strategy.M_star.shape[0] == 1
    cid = scenario.clients[0].name
    assert _states_equal(soft.strategy.model_for(cid), avg.strategy.model_for(cid))
    assert soft.final == avg.final


def test_round_records_bytes_and_routes(scenario: Scenario, fleet: Fleet) -> None:
    sim = _sim(fleet)
    run = sim.run("scaffold", progress=False)
    model_bytes = state_nbytes(sim.initial)
    first, second = run.rounds
    assert set(first.download_bytes.values()) == {model_bytes}  # c = 0: model only
    assert all(b > model_bytes for b in second.download_bytes.values())  # + control variate
    assert all(b > model_bytes for b in first.upload_bytes.values())  # + delta c
    assert second.test is not None and set(second.routes or {}) == {s.name for s in scenario.test}
    assert 0 < run.final["abs_rel"] < 100 and 0 <= run.final["d1"] <= 1
    summary = run.summary()
    assert summary["timing"]["train_seconds"] > 0
    timing = summary["timing"]
    assert 0 <= timing["round_overhead_fraction"] <= timing["overhead_fraction"] < 1
    assert timing["wire_seconds"] > 0 and timing["aggregate_seconds"] > 0
    assert timing["overhead_seconds"] == pytest.approx(
        timing["descriptor_seconds"]
        + timing["setup_seconds"]
        + timing["aggregate_seconds"]
        + timing["wire_seconds"]
    )


def test_centralized_trains_one_pooled_participant(scenario: Scenario, fleet: Fleet) -> None:
    run = _sim(fleet).run("cl", progress=False)
    assert list(run.rounds[0].upload_bytes) == ["pooled"]


def test_centralized_trains_with_its_own_schedule_where_it_sets_one() -> None:
    cfg = replace(CFG, rounds=5, lr=1e-4, warmup_steps=0)
    n = 7
    # unset: the run's recipe, with the steps of the whole federation
    for rnd in range(cfg.rounds):
        assert pooled_recipe(cfg, create_strategy("cl"), rnd, n) == replace(
            cfg.recipe(rnd), local_steps=cfg.local_steps * n
        )
    own = create_strategy("cl", lr=1e-3, round_schedule="cosine", warmup_steps=3)
    lrs = [pooled_recipe(cfg, own, rnd, n).lr for rnd in range(cfg.rounds)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)  # the run's 0.1
    assert lrs == sorted(lrs, reverse=True)
    last = pooled_recipe(cfg, own, cfg.rounds - 1, n)
    assert last == replace(
        cfg.recipe(0), local_steps=cfg.local_steps * n, lr=lrs[-1], warmup_steps=3
    )
    # the run's round schedule stays the run's when CL sets only its lr
    cosine = replace(cfg, round_schedule="cosine", round_final_lr_fraction=0.5)
    assert pooled_recipe(cosine, create_strategy("cl", lr=2e-3), 4, n).lr == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lr": 0}, "lr must be a number > 0"),
        ({"lr": "fast"}, "lr must be a number > 0"),
        ({"round_schedule": "step"}, "unknown round_schedule 'step'"),
        ({"final_lr_fraction": 2}, "final_lr_fraction must lie in"),
        ({"warmup_steps": -1}, "warmup_steps must be an integer"),
    ],
)
def test_centralized_refuses_a_bad_schedule(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"cl: {message}"):
        create_strategy("cl", **params)


@pytest.mark.slow
def test_ray_executor_matches_sequential(scenario: Scenario, fleet: Fleet) -> None:
    from fedepth.sim import RayExecutor

    model = initial_model(CFG)
    seq = Simulation(fleet, get_state(model), CFG, SequentialExecutor()).run(
        "fedprox", progress=False
    )
    ray_exec = RayExecutor(num_cpus=2)
    try:
        par = Simulation(fleet, get_state(model), CFG, ray_exec).run("fedprox", progress=False)
    finally:
        ray_exec.close()
    cid = scenario.clients[0].name
    for k, v in seq.strategy.model_for(cid).items():
        np.testing.assert_array_equal(par.strategy.model_for(cid)[k], v)


def test_a_kept_model_is_rebuilt_when_the_configuration_builds_another() -> None:
    from fedepth.sim.executors import ModelCache

    cache = ModelCache()
    model = cache.get(CFG)
    assert cache.get(replace(CFG, rounds=CFG.rounds + 1, seed=7)) is model  # same model
    other_size = cache.get(replace(CFG, image_size=(48, 64)))
    assert other_size is not model and other_size.input_size == (48, 64)
    other_net = cache.get(replace(CFG, model="newcrfs-lite"))
    assert other_net.model_name == "newcrfs-lite"
    base = cache.get(CFG)  # from CFG alone, so only the loss's variance focus differs next
    assert base.variance_focus != 0.3
    assert cache.get(replace(CFG, variance_focus=0.3)).variance_focus == 0.3
    assert base.encoder.init == "imagenet"  # the default start
    random = cache.get(replace(CFG, encoder_init="random"))
    assert random is not base and random.encoder.init == "random"


def test_the_encoder_start_is_a_setting_of_the_run_and_of_its_checkpoint() -> None:
    assert CFG.encoder_init == "imagenet" and CFG.build_model().encoder.checkpoint is not None
    random = replace(CFG, encoder_init="random")
    assert random.build_model().encoder.checkpoint is None
    assert random.pretrain_key() != CFG.pretrain_key()
    assert random.model_key() != CFG.model_key()
    with pytest.raises(ValueError, match="encoder_init must be one of imagenet, random"):
        replace(CFG, encoder_init="pretrained")
    with pytest.raises(ValueError, match="descriptor_encoder must be one of model, imagenet"):
        replace(CFG, descriptor_encoder="swin")


def test_benchmark_writes_results_report_and_figures(smoke_hpe: Path, tmp_path: Path) -> None:
    spec = BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("fedavg", "hard", "fedepth"),
        out=tmp_path / "out",
        sim=CFG,
        data_dir=smoke_hpe,
        cache_dir=tmp_path / "cache",
        sweep=(0.2, 1.0),
        progress=False,
    )
    run_benchmark(spec, echo=lambda _: None)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    for m in ("fedavg", "hard", "fedepth"):
        assert set(results["methods"][m]) >= {
            "abs_rel",
            "sq_rel",
            "rmse",
            "rmse_log",
            "d1",
            "d2",
            "d3",
        }
    assert set(results["overlap_sweep"]) == {"0.2", "1"}
    assert len(results["overlap_sweep"]["1"]["clusters"]) == 1
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Table 1" in report and "## Table 3a" in report and "## Table 3b" in report
    for png in ("curves.png", "clusters.png", "predictions.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000
    assert json.loads((tmp_path / "out" / "config.json").read_text())["sim"]["rounds"] == 2
    assert list((tmp_path / "cache" / "pretrain").glob("*.safetensors"))


def test_bench_cli_on_bmr(
    smoke_bmr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bmr"
    code = main(
        [
            "bench",
            "--scenario",
            "bmr",
            "--profile",
            "smoke",
            "--data",
            str(smoke_bmr),
            "--methods",
            "fedavg,pacfl,fedepth",
            "--backbone",
            "regression-lite",
            "--rounds",
            "2",
            "--local-steps",
            "1",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "c"),
            "--quiet",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "fedavg" in printed and "pacfl" in printed
    results = json.loads((out / "results.json").read_text())
    groups = results["methods"]["pacfl"]["groups"]
    assert any(g.startswith("environment:") for g in groups)
    # BMR's FeDepth takes the tau whose clusters best reproduce PACFL's partition (the paper's
    # BMR rule), not the 20 % overlap of HPE
    sim = json.loads((out / "config.json").read_text())["sim"]
    assert sim["method_params"]["fedepth"] == {"match": "pacfl"}
    assert "fedepth" in results["methods"]
    params = results["methods"]["fedepth"]["params"]
    assert params["threshold_rule"] == "chosen so the clusters best reproduce PACFL's partition"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "fedavg,nope"], "unknown method(s) nope"),
        (["--backbone", "resnet9000"], "unknown backbone"),
        (["--sweep", "0.2,2"], "--sweep ratios must lie in [0, 1]"),
        (["--image-size", "50x64"], "multiples of 16"),
        (["--weights", "/nonexistent.safetensors"], "no such file"),
    ],
)
def test_bench_cli_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(
        ["bench", "--scenario", "hpe", "--profile", "smoke", "--out", str(tmp_path), *args]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_wire_accounting_encodes_shared_downloads_once_and_flags_non_finite_uploads() -> None:
    a = {"w": np.ones((256, 256), np.float32), "n": np.array(3, np.int64)}
    bad = {"w": np.full((256, 256), np.nan, np.float32), "n": np.array(3, np.int64)}
    # robots sharing one model (same arrays, even in a new dict) cost one encode
    copy = {k: v.copy() for k, v in a.items()}
    assert distinct_payloads([[a]] * 40 + [[dict(a)], [copy], [{}]]) == [[a], [copy]]
    seconds, rejected = wire_seconds([[a]] * 40, [])
    assert seconds > 0 and rejected == []
    _, rejected = wire_seconds([], [[a, {"c": np.zeros(4)}], [bad], [a]])
    assert rejected == [1]


def test_pretrain_does_not_depend_on_the_callers_thread_count(scenario: Scenario) -> None:
    # The checkpoint is trained on config.pretrain_threads threads whatever the caller set, and
    # the caller's setting comes back afterwards.
    cfg = replace(CFG, pretrain_steps=3, pretrain_batch=2)
    before = torch.get_num_threads()
    states = []
    try:
        for ambient in (1, 3):
            torch.set_num_threads(ambient)
            states.append(get_state(pretrain(scenario, cfg, progress=False)))
            assert torch.get_num_threads() == ambient
    finally:
        torch.set_num_threads(before)
    assert _states_equal(states[0], states[1])


def test_pretraining_settings_name_their_own_cache_entry(
    scenario: Scenario, smoke_hpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("fedavg",),
        out=tmp_path / "out",
        sim=replace(CFG, pretrain_steps=2, pretrain_batch=2, pretrain_threads=1),
        data_dir=smoke_hpe,
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    notes: list[str] = []
    path = ensure_weights(spec, scenario, notes.append)
    assert path.name.endswith(f"-2steps-s0-{spec.sim.pretrain_key()}.safetensors")
    # a long job says what it is doing: one line before the pretraining, one after
    assert notes[0] == f"seed 0: pretraining {CFG.model} for 2 steps on 1 thread into {path}"
    assert notes[1].startswith("seed 0: pretrained in ") and len(notes) == 2
    assert ensure_weights(spec, scenario, notes.append) == path and len(notes) == 2  # cached
    # the generator's own scenario given with --data: the name of the generated data's entry
    assert path.name.startswith("hpe-smoke-g")
    default = ensure_weights(replace(spec, sim=replace(spec.sim, pretrain_threads=2)), scenario)
    assert default != path and default.is_file() and path.is_file()
    # another data directory of the same scenario, profile and seed gets its own entry
    other = tmp_path / "edited"
    shutil.copytree(smoke_hpe, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["generator_version"] = -1  # say, data from elsewhere in this layout
    (other / "manifest.json").write_text(json.dumps(manifest))
    got = ensure_weights(replace(spec, data_dir=other), load_scenario(other))
    assert got.name.startswith("hpe-smoke-d") and got.is_file() and got != path
    # every setting the checkpoint depends on is in its cache key
    for change in ({"pretrain_lr": 2e-3}, {"pretrain_warmup": 0.2}, {"pretrain_batch": 4}):
        assert replace(spec.sim, **change).pretrain_key() != spec.sim.pretrain_key()  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        main(["pretrain", "--scenario", "hpe", "--threads", "0", "--out", str(tmp_path / "w")])
    assert "--threads: 0 must be >= 1" in capsys.readouterr().err


class _ConstantDepth(torch.nn.Module):
    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        return torch.full((rgb.shape[0], 1, *rgb.shape[2:]), 3.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_model_on_the_gpu_is_scored_where_its_weights_are(scenario: Scenario) -> None:
    torch.manual_seed(0)
    model = CFG.build_model()
    seq = scenario.test[0]
    on_cpu, _ = evaluate_sequence(model, seq, CFG)
    on_gpu, sample = evaluate_sequence(model.to("cuda"), seq, CFG)
    assert on_gpu == pytest.approx(on_cpu, rel=1e-3)
    assert sample[0][2].dtype == np.float32  # the picture's prediction is back on the CPU


def test_test_frames_are_scored_inside_their_benchmarks_crop(smoke_bmr: Path) -> None:
    config = replace(CFG, eval_frames=2)
    model = _ConstantDepth()
    for seq in load_scenario(smoke_bmr).test:  # NYUv2 (Eigen crop) and KITTI (Garg crop)
        got, _ = evaluate_sequence(model, seq, config)  # type: ignore[arg-type]
        rows = []
        for i in eval_indices(len(seq), config.eval_frames):
            _, depth = resize_frame(seq[i], config.image_size)
            gt = depth[0].numpy()
            crop = evaluation_crop(seq.meta.source, gt.shape)
            assert crop is not None and not crop.all(), seq.meta.source
            rows.append(
                compute_errors(
                    gt, np.full_like(gt, 3.0), seq.meta.min_depth, seq.meta.max_depth, mask=crop
                )
            )
        assert got == mean_errors(rows), seq.name


class _OneRobotDiverges(SequentialExecutor):
    """Trains every client, then turns the first update's weights to NaN."""

    def map(self, config: SimConfig, jobs: Sequence[ClientJob]) -> list[JobResult]:
        results = super().map(config, jobs)
        first = results[0]
        state = {
            k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
            for k, v in first.update.state.items()
        }
        results[0] = replace(first, update=replace(first.update, state=state))
        return results


def test_an_update_with_nan_is_left_out_of_the_round_as_the_coordinator_would(
    scenario: Scenario, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    config = replace(CFG, rounds=1, last_rounds=1)
    initial = get_state(initial_model(config))
    with caplog.at_level("WARNING", logger="fedepth.sim"):
        run = Simulation(fleet, initial, config, _OneRobotDiverges()).run("fedavg", progress=False)
    assert "left out of the round" in caplog.text
    model = run.strategy.model_for(scenario.clients[0].name)
    assert all(np.isfinite(v).all() for v in model.values() if v.dtype.kind == "f")
    assert np.isfinite(run.rounds[0].mean_loss)


def test_the_coordinators_norm_bound_applies_in_process_and_is_off_by_default(
    scenario: Scenario, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    assert not CFG.update_bounds().active  # as the coordinator's validation section
    with pytest.raises(ValueError, match=r"max_group_norms\.state must be a number > 0"):
        replace(CFG, max_group_norms={"state": 0.0})
    config = replace(CFG, rounds=1, last_rounds=1, max_update_norm=1e-12)
    initial = get_state(initial_model(config))
    with caplog.at_level("WARNING", logger="fedepth.sim"):
        run = Simulation(fleet, initial, config).run("fedavg", progress=False)
    # every client moved farther than the bound from the model it downloaded: none aggregated
    assert caplog.text.count("left out of the round") == len(fleet.clients)
    assert "update norm" in caplog.text and "exceeds the bound 1e-12" in caplog.text
    assert _states_equal(run.strategy.model_for(scenario.clients[0].name), initial)
    assert np.isnan(run.rounds[0].mean_loss)


class _TwoOverlappingClusters(FedAvg):
    """Cluster 0 holds every client, cluster 1 the first one; every unseen sequence is served
    by the average of both (a soft route)."""

    def form_clusters(self) -> np.ndarray:
        m = np.ones((2, len(self.clients)), dtype=bool)
        m[1, 1:] = False
        return m

    def route(self, descriptor: Any, **_: Any) -> RouteDecision:
        return RouteDecision(clusters=[0, 1], weights=[0.5, 0.5], state=self.average_of([0, 1]))


class _OverlapSimulation(Simulation):
    def _strategy(self, method: str) -> Strategy:
        return _TwoOverlappingClusters()


def test_an_averaged_route_is_scored_against_each_of_its_clusters_alone(
    scenario: Scenario, fleet: Fleet
) -> None:
    sim = _OverlapSimulation(fleet, get_state(initial_model(CFG)), CFG)
    run = sim.run("overlap", progress=False)
    first, last = run.rounds
    assert first.candidates is None  # only the averaged rounds (the last one here)
    assert last.candidates is not None and set(last.candidates) == {s.name for s in scenario.test}
    strategy = run.strategy
    assert isinstance(strategy, ClusteredStrategy)
    seq = scenario.test[0]
    for k in (0, 1):
        model = CFG.build_model()
        set_state(model, strategy.cluster_states[k])
        alone, _ = evaluate_sequence(model, seq, CFG)
        assert last.candidates[seq.name][str(k)] == alone
    # the two clusters trained on other clients, so the candidates and their average differ
    scores = run.summary()["route_candidates"][seq.name]
    assert scores["clusters"] == [0, 1]
    assert scores["averaged"] == run.per_sequence[seq.name]  # the tables' number
    each = [v["abs_rel"] for v in scores["alone"].values()]
    assert len({scores["averaged"]["abs_rel"], *each}) == 3
    # FeDepth's candidates carry the sequence's S_k (the divergence its route compares with tau)
    fedepth_sim = _sim(fleet)
    soft = fedepth_sim.run("fedepth", progress=False).strategy
    assert isinstance(soft, FeDepth) and soft.M_star.shape[0] > 1
    every = list(range(soft.M_star.shape[0]))
    for seq, desc, _ in fleet.test_queries:
        assert desc is not None
        scored = fedepth_sim.score_candidates(soft, {seq.name: every})[seq.name]
        expected = soft.cluster_scores(desc)
        assert {k: v["jeffreys"] for k, v in scored.items()} == {
            str(k): float(expected[k]) for k in every
        }
        within = np.flatnonzero(expected <= soft.tau).tolist()
        assert soft.route(desc).clusters == (within or [int(np.argmin(expected))])
    # one-cluster routes have nothing to compare
    assert "route_candidates" not in _sim(fleet).run("fedavg", progress=False).summary()
