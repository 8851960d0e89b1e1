"""A benchmark's state on disk: per-round checkpoints of a method's run, and finished runs.

Everything is safetensors + JSON, never pickle, and every file is written to a temporary name
and renamed into place, so an interrupted process leaves either the old file or the new one:

- :func:`save_tree` / :func:`load_tree`: nested mappings of numpy arrays (states, hook memory,
  pictures) in one safetensors file; the structure (key paths in order, empty mappings) rides
  in the file's metadata, so names may hold any character and order and dtypes come back;
- :class:`RunCheckpoint` (a :class:`fedepth.sim.Checkpointer`): ``DIR/checkpoint.json`` (method,
  rounds done, strategy metadata, the round records) names ``DIR/round-<n>.safetensors``
  (strategy states, clients' hook memory, latest pictures); the JSON is replaced last, so it
  always names a complete round, and older round files are removed after it;
- :func:`save_finished` / :func:`load_finished`: a finished run's summary (``summary.json``,
  the marker that the run is done) and its pictures (``samples.safetensors``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from fedepth.atomic import atomic_path, atomic_write_text
from fedepth.sim import RoundRecord, RunState, Sample

#: Format of the files below; a checkpoint of another format is not resumed from.
FORMAT = 1
CHECKPOINT = "checkpoint.json"
SUMMARY = "summary.json"
SAMPLES = "samples.safetensors"


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed into place."""
    atomic_write_text(path, text)


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=_json))


def _json(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _c_order(a: Any) -> np.ndarray:
    arr = np.asarray(a)  # keeps 0-d arrays 0-d (np.ascontiguousarray does not)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def save_tree(path: Path, tree: Mapping[str, Any]) -> None:
    """Nested mappings with numpy arrays as leaves into one safetensors file (atomically)."""
    entries: list[tuple[list[str], int]] = []  # key path, tensor number (-1: empty mapping)
    tensors: dict[str, np.ndarray] = {}

    def walk(node: Mapping[str, Any], prefix: list[str]) -> None:
        if not node and prefix:
            entries.append((prefix, -1))
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, [*prefix, str(key)])
            else:
                tensors[str(len(tensors))] = _c_order(value)
                entries.append(([*prefix, str(key)], len(tensors) - 1))

    walk(tree, [])
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"tree": json.dumps(entries)})


def load_tree(path: Path) -> dict[str, Any]:
    """What :func:`save_tree` wrote: the same nesting, key order, shapes and dtypes."""
    out: dict[str, Any] = {}
    with safe_open(str(path), framework="np") as f:
        for keys, i in json.loads((f.metadata() or {})["tree"]):
            node = out
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = {} if i < 0 else np.array(f.get_tensor(str(i)))
    return out


def _samples_tree(samples: Mapping[str, list[Sample]]) -> dict[str, Any]:
    return {
        seq: {str(i): {"rgb": s[0], "gt": s[1], "pred": s[2]} for i, s in enumerate(rows)}
        for seq, rows in samples.items()
    }


def _samples_from_tree(tree: Mapping[str, Any]) -> dict[str, list[Sample]]:
    return {
        seq: [(r["rgb"], r["gt"], r["pred"]) for r in rows.values()] for seq, rows in tree.items()
    }


class RunCheckpoint:
    """A method's run after its latest finished round, in ``directory`` (see the module doc)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def load(self) -> RunState | None:
        """The saved state, or None when no round was checkpointed here."""
        path = self.directory / CHECKPOINT
        if not path.is_file():
            return None
        head = json.loads(path.read_text(encoding="utf-8"))
        if head.get("format") != FORMAT:
            raise ValueError(f"{path}: checkpoint format {head.get('format')!r}, not {FORMAT}")
        tree = load_tree(self.directory / head["file"])
        return RunState(
            method=head["method"],
            rounds_done=int(head["rounds_done"]),
            strategy_meta=head["strategy"],
            strategy_states=tree.get("strategy", {}),
            memory=tree.get("memory", {}),
            records=[RoundRecord(**r) for r in head["records"]],
            samples=_samples_from_tree(tree.get("samples", {})),
        )

    def save(self, state: RunState) -> None:
        """Write the state of round ``state.rounds_done``; the previous one stays valid until
        the new one is complete."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"round-{state.rounds_done}.safetensors"
        tree = {
            "strategy": state.strategy_states,
            "memory": state.memory,
            "samples": _samples_tree(state.samples),
        }
        save_tree(self.directory / name, tree)
        write_json_atomic(
            self.directory / CHECKPOINT,
            {
                "format": FORMAT,
                "method": state.method,
                "rounds_done": state.rounds_done,
                "file": name,
                "strategy": state.strategy_meta,
                "records": [asdict(r) for r in state.records],
            },
        )
        for old in self.directory.glob("round-*.safetensors"):
            if old.name != name:
                old.unlink()

    def rounds_done(self) -> int:
        """Rounds the saved state holds (0: none)."""
        path = self.directory / CHECKPOINT
        if not path.is_file():
            return 0
        return int(json.loads(path.read_text(encoding="utf-8"))["rounds_done"])

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def save_finished(
    directory: Path, summary: Mapping[str, Any], samples: Mapping[str, list[Sample]]
) -> dict[str, Any]:
    """Keep a finished run (pictures first, then the summary that marks it done); returns the
    summary as it reads back from disk (plain JSON types)."""
    directory.mkdir(parents=True, exist_ok=True)
    save_tree(directory / SAMPLES, _samples_tree(samples))
    text = json.dumps(summary, indent=2, default=_json)
    write_text_atomic(directory / SUMMARY, text)
    return dict(json.loads(text))


def load_finished(directory: Path) -> tuple[dict[str, Any], dict[str, list[Sample]]] | None:
    """A finished run's (summary, pictures), or None when it has not finished."""
    if not (directory / SUMMARY).is_file():
        return None
    summary = json.loads((directory / SUMMARY).read_text(encoding="utf-8"))
    samples = (
        _samples_from_tree(load_tree(directory / SAMPLES))
        if (directory / SAMPLES).is_file()
        else {}
    )
    return summary, samples
