"""Cluster composition: the shares by hand, results.json and report.md, clusters.png's labels
and old outputs that predate it (the coordinator's fleet status:
tests/coordinator/test_fleet_composition.py).

The hand-made fleet of most tests (five clients, three clusters, the second client in two):

    client:   0            1            2           3           4
    labels:   spot/forest  spot/forest  spot/urban  car/forest  car/urban
    clusters: {0, 1, 3}, {1, 2}, {4}

Co-members: 0 -> {1, 3}; 1 -> {0, 2, 3}; 2 -> {1}; 3 -> {0, 1}; 4 -> none (alone).
Same platform: 1/2, 2/3, 1, 0 -> mean 13/24; same environment: 1, 2/3, 0, 1 -> mean 2/3;
both: 1/2, 1/3, 0, 0 -> mean 5/24.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedepth import composition
from fedepth.bench import (
    BenchSpec,
    FleetSummary,
    render_report,
    run_benchmark,
    run_composition,
    run_config,
    sim_config,
    state_dir,
    with_composition,
)
from fedepth.bench.figures import cluster_labels
from fedepth.models import save_weights
from fedepth.runstate import save_finished
from fedepth.sim import TABLE_METRICS, initial_model
from fedepth.strategies import forms_clusters

LABELS = [
    {"platform": "spot", "environment": "forest"},
    {"platform": "spot", "environment": "forest"},
    {"platform": "spot", "environment": "urban"},
    {"platform": "car", "environment": "forest"},
    {"platform": "car", "environment": "urban"},
]
CLUSTERS = [[0, 1, 3], [1, 2], [4]]
M = np.array([[c in row for c in range(5)] for row in CLUSTERS])
SHARES = {"platform": 13 / 24, "environment": 2 / 3, "both": 5 / 24}


def _fleet(*, test_labels: bool = True) -> FleetSummary:
    return FleetSummary(
        data_dir="data",
        weights="w.safetensors",
        clients=[{"name": f"r{c}", **lab} for c, lab in enumerate(LABELS)],
        test=["t-spot-forest", "t-car-urban"],
        means=np.arange(10, dtype=np.float64).reshape(5, 2),
        variances=np.ones((5, 2)),
        test_labels=(
            [{"platform": "spot", "environment": "forest"}, LABELS[4]] if test_labels else []
        ),
    )


# -- the arithmetic (fedepth.composition) -----------------------------------------------------
def test_co_member_shares_are_the_mean_over_clients_computed_by_hand() -> None:
    shares = composition.co_member_shares(M, LABELS)
    assert shares == pytest.approx({**SHARES, "alone": 1.0})
    assert composition.co_members(M, 1).tolist() == [0, 2, 3]
    assert composition.co_members(M, 4).tolist() == []


def test_an_undeclared_label_counts_neither_way() -> None:
    labels = [dict(lab) for lab in LABELS]
    labels[3]["environment"] = ""  # car/? : left out of the environment means it is in
    del labels[2]["platform"]  # ?/urban
    shares = composition.co_member_shares(M, labels)
    # platform: 0 -> {1 spot, 3 car}: 1/2; 1 -> {0, 3} (2 unknown): 1/2; 2 unknown; 3 -> 0
    assert shares["platform"] == pytest.approx((1 / 2 + 1 / 2 + 0) / 3)
    # environment: 0 -> {1}: 1; 1 -> {0 forest, 2 urban}: 1/2; 2 -> {1}: 0; 3 unknown
    assert shares["environment"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert composition.label_of(labels[3]) == "car/?"
    assert composition.member_shares([0, 1], labels, {"platform": "spot"}) == {
        "platform": 1.0,
        "environment": None,
        "both": None,
    }


def test_a_composition_is_counted_most_first_and_written_on_one_line() -> None:
    counts = composition.composition_counts([3, 0, 1, 4], LABELS)
    assert list(counts.items()) == [("spot/forest", 2), ("car/forest", 1), ("car/urban", 1)]
    assert composition.composition_label(counts) == "spot/forest x2, car/forest x1, car/urban x1"
    assert composition.composition_label(counts, most=1) == "spot/forest x2, +2 more"
    shares = composition.member_shares([0, 1, 2, 3], LABELS, LABELS[0])
    assert shares == {"platform": 0.75, "environment": 0.75, "both": 0.5}


def test_the_descriptor_study_uses_the_librarys_shares() -> None:
    from benchmarks import descriptors

    assert descriptors.co_member_shares is composition.co_member_shares
    own = {"platform": "spot", "environment": "forest"}
    assert descriptors.routed_right([0], M, LABELS, own)  # 2 of 3 spot/forest
    assert not descriptors.routed_right([0, 1], M, LABELS, own)  # 2 of 4


def test_only_methods_that_form_clusters_are_clustered() -> None:
    clustered = ["fedepth", "hard", "pacfl", "fedclust", "group-platform", "group-environment"]
    assert all(forms_clusters(m) for m in clustered)
    assert not any(forms_clusters(m) for m in ["fedavg", "fedprox", "feddyn", "scaffold", "cl"])
    assert not forms_clusters("unknown")


# -- results.json and report.md ---------------------------------------------------------------
def test_a_runs_composition_gives_members_shares_and_routed_sequences() -> None:
    comp = run_composition(CLUSTERS, _fleet(), {"t-spot-forest": [0, 1], "t-car-urban": [2]})
    assert comp is not None
    first = comp["clusters"][0]
    assert first["members"] == [
        {"client": 0, "name": "r0", "platform": "spot", "environment": "forest"},
        {"client": 1, "name": "r1", "platform": "spot", "environment": "forest"},
        {"client": 3, "name": "r3", "platform": "car", "environment": "forest"},
    ]
    assert first["counts"] == {"spot/forest": 2, "car/forest": 1}
    assert first["label"] == "spot/forest x2, car/forest x1"
    assert [c["label"] for c in comp["clusters"][1:]] == [
        "spot/forest x1, spot/urban x1",
        "car/urban x1",
    ]
    assert comp["co_members"] == pytest.approx({**SHARES, "alone": 1})
    routed = comp["routes"]["t-spot-forest"]
    assert routed["clusters"] == [0, 1]
    assert (routed["platform"], routed["environment"]) == ("spot", "forest")
    # members of clusters 0 and 1, each once: r0, r1 (spot/forest), r2 (spot/urban), r3 (car)
    assert routed["label"] == "spot/forest x2, spot/urban x1, car/forest x1"
    assert routed["shares"] == {"platform": 0.75, "environment": 0.75, "both": 0.5}
    assert comp["routes"]["t-car-urban"]["shares"] == {
        "platform": 1.0,
        "environment": 1.0,
        "both": 1.0,
    }
    # a fleet recorded without the test sequences' labels: the routes without them
    old = run_composition(CLUSTERS, _fleet(test_labels=False), {"t-car-urban": [2]})
    assert old is not None and old["routes"]["t-car-urban"] == {
        "clusters": [2],
        "counts": {"car/urban": 1},
        "label": "car/urban x1",
    }
    # nothing to describe: no clusters, or indices that do not fit the fleet
    assert run_composition([], _fleet()) is None
    assert run_composition([[0, 9]], _fleet()) is None
    assert "composition" not in with_composition({"clusters": []}, _fleet())


def _summary(clusters: list[list[int]], routes: dict[str, list[int]]) -> dict[str, Any]:
    """A run's summary as runs recorded before the composition existed wrote it."""
    metrics = dict.fromkeys(TABLE_METRICS, 0.5)
    return {
        **metrics,
        "final_all": metrics,
        "groups": {},
        "per_sequence": {s: {"abs_rel": 0.5} for s in routes},
        "clusters": clusters,
        "params": {"tau": 1.0},
        "curves": {"round": [0], "train_loss": [1.0], "abs_rel": [0.5]},
        "timing": dict.fromkeys(
            (
                "train_seconds",
                "overhead_seconds",
                "overhead_fraction",
                "round_overhead_fraction",
                "descriptor_seconds",
                "setup_seconds",
                "aggregate_seconds",
                "wire_seconds",
            ),
            1.0,
        ),
        "bytes_per_round": {"download_mean": 1.0, "upload_mean": 1.0, "per_round": []},
        "routes": routes,
        "transport": "inprocess",
    }


ROUTES = {"t-spot-forest": [0, 1], "t-car-urban": [2]}


def _results(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "scenario": "hpe",
        "profile": "smoke",
        "seed": 0,
        "seeds": {"0": {}},
        "backbone": "regression-lite",
        "num_clients": 5,
        "num_test_sequences": 2,
        "wall_seconds": 1.0,
        "methods": methods,
    }


def test_the_report_gives_each_clusters_members_and_each_routed_sequence() -> None:
    fedepth = with_composition(_summary(CLUSTERS, ROUTES), _fleet())
    fedavg = _summary([[0, 1, 2, 3, 4]], {s: [0] for s in ROUTES})
    report = render_report(_results({"fedavg": fedavg, "fedepth": fedepth}))
    section = report.split("## Cluster composition")[1].split("## Communication")[0]
    assert "| fedepth | - | 3 | 0.54 | 0.67 | 0.21 | 1 |" in section
    assert "fedavg" not in section  # one global model: no clusters to describe
    assert "- cluster 0 (3): spot/forest x2, car/forest x1: r0, r1, r3" in section
    assert "- cluster 2 (1): car/urban x1: r4" in section
    assert (
        "| t-spot-forest | spot/forest | 0, 1 | spot/forest x2, spot/urban x1, car/forest x1 "
        "| 0.75 | 0.75 |"
    ) in section

    # several seeds: a row per seed and their mean ± std; the details are the first seed's
    other = with_composition(_summary([[0, 1], [2], [3, 4]], ROUTES), _fleet())
    per_seed = {"0": fedepth, "1": other}
    entry = {**fedepth, "seeds": per_seed}
    report = render_report({**_results({"fedepth": entry}), "seeds": {"0": {}, "1": {}}})
    # seed 1: 0 <-> 1 (spot/forest), 3 <-> 4 (car, forest/urban); 2 alone
    assert "| fedepth | 1 | 3 | 1.00 | 0.50 | 0.50 | 1 |" in report
    assert "| fedepth | mean ± std | - | 0.77 ± 0.32 | 0.58 ± 0.12 | 0.35 ± 0.21 | - |" in report
    assert "### fedepth (seed 0)" in report


def test_results_recorded_before_the_composition_still_report() -> None:
    old = _results({"fedepth": _summary(CLUSTERS, ROUTES)})
    report = render_report(old)
    assert "## Table 1: methods" in report and "Cluster composition" not in report


def test_clusters_png_labels_each_cluster_by_its_composition() -> None:
    clients = _fleet().clients
    assert cluster_labels(M, clients) == [
        "0: spot/forest x2, car/forest x1",
        "1: spot/forest x1, spot/urban x1",
        "2: car/urban x1",
    ]
    assert cluster_labels(M, clients, most=1)[0] == "0: spot/forest x2, +1 more"


def test_an_out_recorded_before_the_composition_loads_and_reports_it(tmp_path: Path) -> None:
    """A benchmark output written before this change (summaries without ``composition``, a
    fleet.json without the test sequences' labels) resumes with nothing to run and gets the
    composition in results.json and report.md, from what it recorded."""
    cfg = sim_config("hpe", "smoke", model="regression-lite", rounds=1, last_rounds=1)
    spec = BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("fedavg", "fedepth"),
        out=tmp_path / "out",
        sim=cfg,
        progress=False,
    )
    spec.out.mkdir()
    (spec.out / "config.json").write_text(json.dumps(run_config(spec)))
    sdir = state_dir(spec.out, 0)
    _fleet().save(sdir)
    head = json.loads((sdir / "fleet.json").read_text())
    del head["test_labels"]  # as fleets were recorded before
    (sdir / "fleet.json").write_text(json.dumps(head))
    save_finished(sdir / "fedavg", _summary([[0, 1, 2, 3, 4]], {s: [0] for s in ROUTES}), {})
    save_finished(sdir / "fedepth", _summary(CLUSTERS, ROUTES), {})

    lines: list[str] = []
    results = run_benchmark(spec, echo=lines.append)
    assert lines == [
        f"fedavg: seed 0 finished earlier ({sdir / 'fedavg'})",
        f"fedepth: seed 0 finished earlier ({sdir / 'fedepth'})",
    ]
    written = json.loads((spec.out / "results.json").read_text())
    assert "composition" not in written["methods"]["fedavg"]
    comp = written["methods"]["fedepth"]["composition"]
    assert comp == written["methods"]["fedepth"]["seeds"]["0"]["composition"]
    assert comp["co_members"] == pytest.approx({**SHARES, "alone": 1})
    assert comp["routes"]["t-spot-forest"]["label"] == (
        "spot/forest x2, spot/urban x1, car/forest x1"
    )
    assert "shares" not in comp["routes"]["t-spot-forest"]  # no test labels recorded then
    assert results["methods"]["fedepth"]["composition"] == comp
    report = (spec.out / "report.md").read_text()
    assert "| t-spot-forest | - | 0, 1 | spot/forest x2, spot/urban x1, car/forest x1 |" in report
    assert (spec.out / "clusters.png").stat().st_size > 0
    # the state is as it was: the composition is derived, never written back
    assert "composition" not in json.loads((sdir / "fedepth" / "summary.json").read_text())


def test_a_run_records_its_test_sequences_labels_and_routes_them_by_composition(
    smoke_hpe: Path, tmp_path: Path
) -> None:
    cfg = sim_config(
        "hpe",
        "smoke",
        model="regression-lite",
        rounds=1,
        local_steps=1,
        last_rounds=1,
        eval_frames=1,
        descriptor_frames=4,
    )
    weights = tmp_path / "w.safetensors"
    save_weights(initial_model(cfg), weights)
    spec = BenchSpec(
        scenario="hpe",
        profile="smoke",
        methods=("fedepth",),
        out=tmp_path / "out",
        sim=cfg,
        data_dir=smoke_hpe,
        weights=weights,
        progress=False,
    )
    results = run_benchmark(spec, echo=lambda _: None)
    fleet = FleetSummary.load(state_dir(spec.out, 0))
    assert fleet is not None and len(fleet.test_labels) == len(fleet.test)
    run = results["methods"]["fedepth"]
    comp = run["composition"]
    members = sorted(m["client"] for c in comp["clusters"] for m in c["members"])
    assert sorted(set(members)) == list(range(len(fleet.clients)))
    assert [[m["client"] for m in c["members"]] for c in comp["clusters"]] == run["clusters"]
    assert set(comp["routes"]) == set(fleet.test)
    for seq, own in zip(fleet.test, fleet.test_labels, strict=True):
        route = comp["routes"][seq]
        assert route["clusters"] == run["routes"][seq]
        assert (route["platform"], route["environment"]) == (own["platform"], own["environment"])
        routed = {m["client"] for k in route["clusters"] for m in comp["clusters"][k]["members"]}
        assert sum(route["counts"].values()) == len(routed)
