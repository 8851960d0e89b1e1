"""Tests of the validation split (the held-out tails of the clients' own sequences), of the
choice of a sweep point on it, and of the command line's refusals."""

from __future__ import annotations

import json
from collections.abc import Sequence as AbcSequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from fedepth.bench import render_report, sim_config
from fedepth.bench.choice import choose_by_validation, validation_choice
from fedepth.bench.combine import combine_seeds
from fedepth.data import Client, Frame, Sequence, SequenceMeta, SubSequence, load_scenario
from fedepth.data.holdout import ValidationSplitError, holdout_validation, split_tail
from fedepth.models import get_state, save_weights
from fedepth.sim import (
    ClientJob,
    JobResult,
    RoundRecord,
    SequentialExecutor,
    SimConfig,
    Simulation,
    final_validation,
    initial_model,
    prepare_fleet,
)
from fedepth_cli.main import main

CFG = sim_config(
    "hpe",
    "smoke",
    model="regression-lite",
    rounds=2,
    local_steps=1,
    last_rounds=2,
    eval_frames=1,
    descriptor_frames=4,
)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "w.safetensors"
    save_weights(initial_model(CFG), path)
    return path


# -- the split ---------------------------------------------------------------------------------
class _Frames(Sequence):
    """n tiny frames; every frame read is noted in ``reads`` while ``watching`` is on."""

    watching: ClassVar[bool] = False
    reads: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, name: str, n: int, base: Sequence | None = None) -> None:
        super().__init__(name, SequenceMeta("car", "forest", "m3ed", "train"))
        self.n, self.base = n, base

    def __len__(self) -> int:
        return self.n

    def _frame(self, i: int) -> Frame:
        if _Frames.watching:
            _Frames.reads.append((self.name, i))
        if self.base is not None:
            return self.base[i]
        return Frame(np.zeros((2, 2, 3), np.uint8), np.ones((2, 2), np.float32), np.eye(3), i)


def test_the_validation_split_is_the_rounded_tail_of_every_sequence() -> None:
    head, tail = split_tail(_Frames("a", 10), 0.25)  # 2.5 frames: rounded half up to 3
    assert isinstance(head, SubSequence) and head.name == "a"
    assert head.indices.tolist() == list(range(7))
    assert tail.indices.tolist() == [7, 8, 9] and tail.name == "a/validation"

    clients = [Client("c", "car", "forest", [_Frames("s1", 10), _Frames("s2", 4)])]
    train, validation = holdout_validation(clients, 0.25)
    assert [len(s) for s in train[0].sequences] == [7, 3] and train[0].num_samples == 10
    assert [len(s) for s in validation["c"]] == [3, 1]
    untouched, none = holdout_validation(clients, 0.0)
    assert untouched[0].num_samples == 14 and none == {"c": []}


@pytest.mark.parametrize(
    ("share", "message"),
    [
        (0.95, "a validation share of 0.95 leaves client short no training frame (of its 2 "),
        (0.1, "a validation share of 0.1 leaves client short no validation frame (of its 2 "),
        (1.0, "the validation share must lie in [0, 1), got 1.0"),
        (-0.1, "the validation share must lie in [0, 1), got -0.1"),
    ],
)
def test_a_share_that_leaves_a_client_no_training_or_validation_frame_names_it(
    share: float, message: str
) -> None:
    clients = [
        Client("long", "car", "forest", [_Frames("l", 40)]),
        Client("short", "car", "forest", [_Frames("s", 2)]),
    ]
    with pytest.raises(ValidationSplitError) as info:
        holdout_validation(clients, share)
    assert str(info.value).startswith(message)
    with pytest.raises(ValueError):
        SimConfig(validation_share=-0.5)


def _watched(root: Path) -> Any:
    """The smoke scenario with every client sequence noting the frames read from it."""
    scenario = load_scenario(root)
    for c in scenario.clients:
        c.sequences = [_Frames(s.name, len(s), s) for s in c.sequences]
    return scenario


class _WatchingExecutor(SequentialExecutor):
    """Notes the frames the clients' training reads (and only those)."""

    def map(self, config: SimConfig, jobs: AbcSequence[ClientJob]) -> list[JobResult]:
        _Frames.watching = True
        try:
            return super().map(config, jobs)
        finally:
            _Frames.watching = False


def test_clients_train_and_are_described_without_their_validation_tails_scored_each_round(
    smoke_hpe: Path,
) -> None:
    cfg = replace(CFG, validation_share=0.3)
    model = initial_model(cfg)
    scenario = _watched(smoke_hpe)
    lengths = {s.name: len(s) for c in scenario.clients for s in c.sequences}
    cut = {name: n - int(np.floor(0.3 * n + 0.5)) for name, n in lengths.items()}
    _Frames.reads = []
    _Frames.watching = True  # the descriptors read only the training heads too
    fleet = prepare_fleet(scenario, model, cfg, progress=False)
    _Frames.watching = False
    described = list(_Frames.reads)
    assert described and all(i < cut[name] for name, i in described)
    for c in fleet.clients:
        (head,) = c.sequences
        (tail,) = fleet.validation[c.name]
        assert isinstance(head, SubSequence) and isinstance(tail, SubSequence)
        n = lengths[head.name]
        assert head.indices.tolist() == list(range(cut[head.name]))
        assert tail.indices.tolist() == list(range(cut[head.name], n))  # the tail
        assert c.num_samples == cut[head.name] < n  # fewer frames to train on
    assert [i.num_samples for i in fleet.infos] == [c.num_samples for c in fleet.clients]

    _Frames.reads = []
    run = Simulation(fleet, get_state(model), cfg, _WatchingExecutor()).run(
        "fedepth", progress=False
    )
    trained = list(_Frames.reads)
    assert trained and all(i < cut[name] for name, i in trained)  # no validation frame
    assert {name for name, _ in trained} == set(lengths)
    names = {c.name for c in fleet.clients}
    for rec in run.rounds:  # smoke: every round is one of the last two, evaluated
        assert rec.validation is not None and rec.test is not None
        assert {k.removeprefix("client:") for k in rec.validation if k != "all"} == names
        mean = np.mean([rec.validation[f"client:{n}"]["abs_rel"] for n in names])
        assert rec.validation["all"]["abs_rel"] == pytest.approx(mean)
    summary = run.summary()
    val = summary["validation"]
    assert set(val["per_client"]) == names and len(val["curve"]) == cfg.rounds
    assert val["abs_rel"] == pytest.approx(np.mean(val["curve"]))
    assert val["abs_rel"] != summary["abs_rel"]  # not the test sequences' number
    scenario.close()


def test_a_share_of_zero_is_the_run_without_a_validation_split(smoke_hpe: Path) -> None:
    model = initial_model(CFG)
    runs = []
    for cfg in (CFG, replace(CFG, validation_share=0.0)):
        scenario = load_scenario(smoke_hpe)
        fleet = prepare_fleet(scenario, model, cfg, progress=False)
        assert fleet.validation == {} and fleet.scenario is scenario  # nothing wrapped
        run = Simulation(fleet, get_state(model), cfg).run("fedepth", progress=False)
        runs.append((run, run.strategy.state_dict()))
        scenario.close()
    (a, (meta_a, states_a)), (b, (meta_b, states_b)) = runs
    assert "validation" not in a.summary() and all(r.validation is None for r in a.rounds)
    assert a.final == b.final and a.per_sequence == b.per_sequence and meta_a == meta_b
    for key, state in states_a.items():
        for name, value in state.items():
            assert np.array_equal(value, states_b[key][name])


# -- final numbers and the choice ------------------------------------------------------------
def _record(rnd: int, validation: dict[str, float] | None) -> RoundRecord:
    return RoundRecord(
        rnd,
        0.0,
        0.0,
        0.0,
        1.0,
        {},
        {},
        validation=None
        if validation is None
        else {
            "all": {"abs_rel": float(np.mean(list(validation.values())))},
            **{f"client:{k}": {"abs_rel": v} for k, v in validation.items()},
        },
    )


def test_the_final_validation_numbers_are_the_mean_over_the_last_rounds() -> None:
    records = [_record(0, {"a": 9.0, "b": 9.0}), _record(1, None), _record(2, {"a": 1, "b": 3})]
    final = final_validation(records, 2)
    assert final["abs_rel"] == 2.0 and final["per_client"] == {
        "a": {"abs_rel": 1.0},
        "b": {"abs_rel": 3.0},
    }
    assert final["curve"] == [9.0, None, 2.0]
    assert final_validation([_record(0, None)], 2) == {}


def _entry(test: float, validation: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"abs_rel": test, "clusters": [[0]]}
    if validation is not None:
        out["validation"] = {"abs_rel": validation}
    return out


def test_the_chosen_point_is_the_one_of_lowest_validation_abs_rel_never_test() -> None:
    points = {"0": _entry(0.10, 0.30), "0.2": _entry(0.50, 0.20), "1": _entry(0.05, None)}
    assert choose_by_validation(points) == "0.2"  # not "1", the lowest test number
    assert choose_by_validation({"x": _entry(0.1, 0.2), "y": _entry(0.1, 0.2)}) == "x"
    assert choose_by_validation({"x": _entry(0.1, None)}) is None
    results = {
        "overlap_sweep": points,
        "rule_sweep": {"merge=cliques": _entry(0.01, 0.25)},
    }
    chosen = validation_choice(results)
    assert chosen is not None
    assert (chosen["name"], chosen["sweep"], chosen["point"]) == (
        "fedepth@20%",
        "overlap_sweep",
        "0.2",
    )
    assert (chosen["validation_abs_rel"], chosen["test_abs_rel"]) == (0.20, 0.50)
    assert set(chosen["candidates"]) == {
        "fedepth@0%",
        "fedepth@20%",
        "fedepth@100%",
        "fedepth merge=cliques",
    }
    results["rule_sweep"]["merge=cliques"]["validation"]["abs_rel"] = 0.1
    assert validation_choice(results)["name"] == "fedepth merge=cliques"  # type: ignore[index]
    assert validation_choice({"overlap_sweep": {"0": _entry(0.1, None)}}) is None


def test_validation_numbers_combine_over_seeds() -> None:
    def seed(v: float) -> dict[str, Any]:
        return {
            "abs_rel": 0.5,
            "validation": {
                "abs_rel": v,
                "final_all": {"abs_rel": v},
                "per_client": {"a": {"abs_rel": v}},
                "curve": [None, v],
            },
        }

    got = combine_seeds({"0": seed(0.2), "1": seed(0.4)})["validation"]
    assert got["abs_rel"] == pytest.approx(0.3) and got["abs_rel_std"] > 0
    assert got["per_client"]["a"]["abs_rel"] == pytest.approx(0.3)
    assert got["curve"] == [None, pytest.approx(0.3)]


# -- the command line --------------------------------------------------------------------------
def _bench(out: Path, data: Path, weights: Path, *extra: str) -> int:
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
            "fedepth",
            "--backbone",
            "regression-lite",
            "--local-steps",
            "1",
            "--rounds",
            "2",
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--validation-share", "1"), "--validation-share must lie in [0, 1)"),
        (("--validation-share", "-0.1"), "--validation-share must lie in [0, 1)"),
        (("--validation-share", "nan"), "--validation-share must lie in [0, 1)"),
        (
            ("--validation-share", "0.95"),
            "a validation share of 0.95 leaves client car_urban_day_penno_small_loop no "
            "training frame",
        ),
        (
            ("--validation-share", "0.05"),
            "a validation share of 0.05 leaves client car_urban_day_penno_small_loop no "
            "validation frame",
        ),
        (("--validation-share", "0.3", "--transport", "grpc"), "use the in-process transport"),
        (("--sweep", "merge=nope"), "--sweep merge=nope: "),
        (("--sweep", "tau=1,2"), "--sweep tau=1,2: give overlap ratios"),
    ],
)
def test_bench_cli_refuses_a_bad_validation_share_or_rule_sweep_in_one_line(
    smoke_hpe: Path,
    weights: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    out = tmp_path / "out"
    assert _bench(out, smoke_hpe, weights, *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedepth bench: error: ") and message in err
    assert not out.exists()  # refused before anything is written


def test_bench_cli_chooses_the_rule_of_lowest_validation_abs_rel_and_reports_it(
    smoke_hpe: Path, weights: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rules"
    args = ("--validation-share", "0.3", "--sweep", "merge=subsets,cliques")
    assert _bench(out, smoke_hpe, weights, *args) == 0
    results = json.loads((out / "results.json").read_text())
    points = results["rule_sweep"]
    assert list(points) == ["merge=subsets", "merge=cliques"]
    assert points["merge=cliques"]["params"]["merge"] == "cliques"
    assert "validation" in results["methods"]["fedepth"]
    chosen = results["chosen"]
    best = min(points, key=lambda p: points[p]["validation"]["abs_rel"])
    assert chosen["point"] == best and chosen["name"] == f"fedepth {best}"
    assert chosen["test_abs_rel"] == points[best]["abs_rel"]
    report = (out / "report.md").read_text()
    assert f"| fedepth {best} |" in report and "chosen (validation)" in report
    assert render_report(results) == report
    assert json.loads((out / "config.json").read_text())["sim"]["validation_share"] == 0.3
