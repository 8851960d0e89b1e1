"""The files the gRPC benchmark's driver and its robot processes share, and what it reads back.

The driver (:mod:`fedepth_coordinator.benchrun`) hands the fleet over in its work directory,
which the robot processes (:mod:`fedepth_coordinator.benchrobot`) read: ``fleet.json`` (the data
root, the ``SimConfig`` and each robot's labels, sample count and descriptor frames),
``fleet.npz`` (descriptors and summaries, float64), ``tokens.json``, ``initial.safetensors``
(the served weights with their card); then ``sessions/<k>.json`` per method run (the
coordinator to join), ``robots/<id>.ready`` and ``results/<k>/<id>.json`` from the robots.
Nothing else passes between them: rounds are paced by the coordinator (the parent releases the
rounds it holds for evaluation).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from fedepth.atomic import atomic_write_text
from fedepth.models.card import CARD_KEY, card_of
from fedepth.sim import Fleet, SimConfig, config_dict

#: The principal the parent routes test sequences as.
OPERATOR = "bench-operator"


def robot_id(index: int, name: str, count: int) -> str:
    """The coordinator id of scenario client ``index``: numbered so that sorting the ids (the
    coordinator's order) gives the scenario order, and restricted to the id alphabet."""
    width = max(3, len(str(count - 1)))
    return f"c{index:0{width}d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"[:64]


class BenchRunError(RuntimeError):
    """A robot process or the coordinator failed; the message points at its log."""


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data))


def eval_rounds(config: SimConfig) -> list[int]:
    """The rounds the in-process simulation evaluates after."""
    return [
        r
        for r in range(config.rounds)
        if r >= config.rounds - config.last_rounds
        or (config.eval_every and (r + 1) % config.eval_every == 0)
    ]


def write_fleet(
    workdir: Path,
    fleet: Fleet,
    initial: dict[str, np.ndarray],
    config: SimConfig,
    ids: Sequence[str],
    tokens: Mapping[str, str],
) -> None:
    """Hand the fleet over to the robot processes (robot ``ids[i]`` is ``fleet.infos[i]``)."""
    w = workdir
    c = config
    # the configured model's own card (encoder, its start and checkpoint included)
    card = card_of(c.build_model(), input_size=(int(c.image_size[0]), int(c.image_size[1])))
    save_file(initial, str(w / "initial.safetensors"), metadata={CARD_KEY: card.to_json()})
    arrays: dict[str, np.ndarray] = {}
    robots: dict[str, Any] = {}
    for rid, info in zip(ids, fleet.infos, strict=True):
        if info.descriptor is None:
            raise ValueError(f"client {info.cid!r} has no descriptor")
        d = info.descriptor
        arrays[f"{rid}/mean"] = d.mean
        arrays[f"{rid}/var"] = d.var
        arrays.update({f"{rid}/extra/{k}": np.asarray(v) for k, v in info.extra.items()})
        robots[rid] = {
            "cid": info.cid,
            "num_samples": info.num_samples,
            "num_frames": d.num_frames,
            "labels": dict(info.labels),
            "extra": sorted(info.extra),
        }
    # float64 in, float64 out: the robots send exactly the parent's descriptors
    np.savez(w / "fleet.npz", **arrays)  # type: ignore[arg-type]
    # the robots' tokens are throwaway (loopback, this run only); removed at close
    fd = os.open(w / "tokens.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(tokens, f)
    write_json(
        w / "fleet.json",
        {
            "data_root": str(Path(fleet.scenario.root).resolve()),
            "sim": config_dict(config),
            "robots": robots,
        },
    )
