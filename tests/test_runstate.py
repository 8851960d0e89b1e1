"""Tests of the benchmark's state on disk: array trees, per-round checkpoints, finished runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedepth.runstate import (
    RunCheckpoint,
    load_finished,
    load_tree,
    save_finished,
    save_tree,
)
from fedepth.sim import RoundRecord, RunState


def _record(rnd: int, test: bool = False) -> RoundRecord:
    return RoundRecord(
        round=rnd,
        train_seconds=0.5,
        aggregate_seconds=0.01,
        wire_seconds=0.02,
        mean_loss=1.0 / 3.0 + rnd,
        download_bytes={"a/b": 10, "c": 12},
        upload_bytes={"a/b": 11, "c": 13},
        test={"all": {"abs_rel": 0.1 + 1e-17 * rnd, "d1": 2.0 / 3.0}} if test else None,
        routes={"seq": [0, 2]} if test else None,
    )


def test_a_tree_of_arrays_comes_back_with_its_nesting_order_shapes_and_dtypes(
    tmp_path: Path,
) -> None:
    tree = {
        "strategy": {"cluster/1": {"w.x": np.arange(6, dtype=np.float32).reshape(2, 3).T}},
        "memory": {"robot/1": {}, "robot 2": {"c": {"n": np.array(3, np.int64)}}},
        "h": np.full(4, 1 / 3, np.float64),
        "flags": np.array([True, False]),
        "empty": {},
    }
    save_tree(tmp_path / "t.safetensors", tree)
    back = load_tree(tmp_path / "t.safetensors")
    assert list(back) == list(tree)
    assert list(back["memory"]) == ["robot/1", "robot 2"] and back["memory"]["robot/1"] == {}
    n = back["memory"]["robot 2"]["c"]["n"]
    assert n.shape == () and n.dtype == np.int64 and int(n) == 3
    w = back["strategy"]["cluster/1"]["w.x"]
    assert w.dtype == np.float32 and np.array_equal(w, tree["strategy"]["cluster/1"]["w.x"])
    assert back["h"].dtype == np.float64 and np.array_equal(back["h"], tree["h"])
    assert back["flags"].dtype == bool and back["empty"] == {}
    w[0, 0] = 5.0  # arrays that come back are the caller's to change
    assert not list(tmp_path.glob("*.tmp"))
    # safetensors: a JSON header and raw bytes, nothing a loader would execute
    header_len = int.from_bytes((tmp_path / "t.safetensors").read_bytes()[:8], "little")
    json.loads((tmp_path / "t.safetensors").read_bytes()[8 : 8 + header_len])


def _state(rounds: int) -> RunState:
    rng = np.random.default_rng(rounds)
    return RunState(
        method="scaffold",
        rounds_done=rounds,
        strategy_meta={"name": "scaffold", "M_star": [[1, 1]], "tau": float("inf")},
        strategy_states={
            "cluster/0": {"w": rng.normal(size=(3, 2)).astype(np.float32)},
            "scaffold/control": {},
        },
        memory={"a/b": {"scaffold.client_control": {"w": rng.normal(size=3)}}, "c": {}},
        records=[_record(r, test=r == rounds - 1) for r in range(rounds)],
        samples={"seq": [(np.zeros((2, 2, 3)), np.ones((2, 2)), np.full((2, 2), 0.5))]},
    )


def test_a_checkpoint_holds_the_latest_round_exactly(tmp_path: Path) -> None:
    ck = RunCheckpoint(tmp_path / "ck")
    assert ck.load() is None and ck.rounds_done() == 0
    ck.save(_state(1))
    ck.save(_state(2))
    assert ck.rounds_done() == 2
    assert sorted(p.name for p in ck.directory.iterdir()) == [
        "checkpoint.json",
        "round-2.safetensors",
    ]
    saved, want = ck.load(), _state(2)
    assert saved is not None
    assert saved.method == want.method and saved.rounds_done == 2
    assert saved.strategy_meta == want.strategy_meta  # inf survives
    assert saved.records == want.records  # floats exact through JSON
    assert saved.strategy_states.keys() == want.strategy_states.keys()
    assert saved.strategy_states["scaffold/control"] == {}
    assert np.array_equal(
        saved.strategy_states["cluster/0"]["w"], want.strategy_states["cluster/0"]["w"]
    )
    assert saved.memory.keys() == want.memory.keys() and saved.memory["c"] == {}
    got = saved.memory["a/b"]["scaffold.client_control"]["w"]
    assert np.array_equal(got, want.memory["a/b"]["scaffold.client_control"]["w"])
    assert all(
        np.array_equal(a, b)
        for a, b in zip(saved.samples["seq"][0], want.samples["seq"][0], strict=True)
    )
    ck.clear()
    assert not ck.directory.exists()


def test_an_interrupted_checkpoint_write_leaves_the_previous_round(tmp_path: Path) -> None:
    ck = RunCheckpoint(tmp_path / "ck")
    ck.save(_state(1))
    # a process killed while writing round 2: its array file is there, the JSON is not
    save_tree(ck.directory / "round-2.safetensors", {"strategy": {}})
    (ck.directory / "checkpoint.json.tmp").write_text("{trunc")
    saved = ck.load()
    assert saved is not None and saved.rounds_done == 1 and len(saved.records) == 1


def test_a_finished_run_reads_back_as_plain_json(tmp_path: Path) -> None:
    assert load_finished(tmp_path / "run") is None
    summary = {"abs_rel": np.float64(0.25), "clusters": [[0, 1]], "params": {"tau": np.inf}}
    pictures = {"seq": [(np.zeros((2, 2, 3)), np.ones((2, 2)), np.ones((2, 2)))], "other": []}
    back = save_finished(tmp_path / "run", summary, pictures)
    assert back == {"abs_rel": 0.25, "clusters": [[0, 1]], "params": {"tau": float("inf")}}
    assert type(back["abs_rel"]) is float
    loaded = load_finished(tmp_path / "run")
    assert loaded is not None
    assert loaded[0] == back
    assert list(loaded[1]) == ["seq", "other"] and loaded[1]["other"] == []
    assert np.array_equal(loaded[1]["seq"][0][1], np.ones((2, 2)))
