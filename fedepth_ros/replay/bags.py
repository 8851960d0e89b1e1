"""The replay's bags: a scenario written as one bag per client and per test sequence
(``bags.json``, the cache of bags written before), read back and checked."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedepth.data.bags import BagError, bag_info
from fedepth.runstate import write_json_atomic
from fedepth_ros.replay.spec import ReplayError

BAGS_MANIFEST = "bags.json"


@dataclass(frozen=True)
class BagEntry:
    """One bag of the replay: a client's (training) or a test sequence's."""

    name: str
    bag: Path
    frames: int
    platform: str = ""
    environment: str = ""
    #: what is wrong with the bag ("" = usable)
    problem: str = ""


def check_bag(path: Path, *, need_depth: bool = True) -> tuple[int, str]:
    """(image frames, problem) of a bag: a missing /image, /depth or /camera_info, or an
    unreadable bag, is a one-line problem ("" when usable)."""
    try:
        info = bag_info(path)
    except BagError as exc:
        return 0, str(exc)
    topics = {t.name.lstrip("/"): t.count for t in info.topics}
    wanted = ["image", "camera_info"] + (["depth"] if need_depth else [])
    missing = [t for t in wanted if not topics.get(t)]
    if missing:
        return topics.get("image", 0), f"bag {path} has no /{', /'.join(missing)} messages"
    return topics["image"], ""


def _stamped_frames(seqs: Sequence[Any], rate_hz: float) -> Any:
    """The frames of ``seqs`` in order with strictly increasing stamps: a sequence without
    increasing stamps (NYUv2) gets ``index x period``; the next sequence starts one period
    after the previous one ends."""
    period = round(1e9 / rate_hz)
    offset = 0
    last = -1
    for seq in seqs:
        synthetic = seq.meta.source == "nyu" or (
            len(seq) > 1 and seq[1].stamp_ns <= seq[0].stamp_ns
        )
        for i, frame in enumerate(seq):
            stamp = i * period if synthetic else int(frame.stamp_ns)
            stamp += offset
            if stamp <= last:
                offset += last + period - stamp
                stamp = last + period
            last = stamp
            yield replace(frame, stamp_ns=stamp)


def write_scenario_bags(scenario_dir: Path, out: Path, rate_hz: float = 10.0) -> Path:
    """Each client's sequences (one bag per client, sequences in order) and each test
    sequence as bags under ``out`` with ``bags.json``; bags written before are kept."""
    from fedepth.data.bag_writer import write_rgbd_bag
    from fedepth.data.scenario import load_scenario

    scenario = load_scenario(scenario_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries: dict[str, list[dict[str, Any]]] = {"clients": [], "test": []}

    def one(kind: str, name: str, seqs: Sequence[Any], platform: str, env: str) -> None:
        path = out / kind / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        if not (path / "metadata.yaml").is_file():
            tmp = path.with_name(path.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            meta = seqs[0].meta
            write_rgbd_bag(
                _stamped_frames(seqs, rate_hz),
                tmp,
                custom_data={
                    "fedepth.source": meta.source,
                    "fedepth.sequence": name,
                    "fedepth.platform": platform,
                    "fedepth.environment": env,
                    "fedepth.split": meta.split,
                    "fedepth.min_depth": f"{meta.min_depth:g}",
                    "fedepth.max_depth": f"{meta.max_depth:g}",
                },
                progress=False,
                total=sum(len(s) for s in seqs),
            )
            tmp.rename(path)
        entries[kind].append(
            {
                "name": name,
                "bag": str(path.relative_to(out)),
                "frames": sum(len(s) for s in seqs),
                "platform": platform,
                "environment": env,
            }
        )

    try:
        for c in scenario.clients:
            one("clients", c.name, c.sequences, c.platform, c.environment)
        for s in scenario.test:
            one("test", s.name, [s], s.meta.platform, s.meta.environment)
    finally:
        scenario.close()
    manifest = {
        "format": "fedepth-replay-bags",
        "scenario": scenario.name,
        "profile": scenario.profile,
        "seed": scenario.seed,
        "scenario_dir": str(Path(scenario_dir).resolve()),
        **entries,
    }
    write_json_atomic(out / BAGS_MANIFEST, manifest)
    return out


def read_bags(bag_dir: Path) -> tuple[dict[str, Any], list[BagEntry], list[BagEntry]]:
    """The manifest, client bags and test bags of a bag directory, each bag checked."""
    path = bag_dir / BAGS_MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{path}: cannot read the bag manifest ({exc})") from None

    def entries(kind: str, need_depth: bool) -> list[BagEntry]:
        out = []
        for e in manifest.get(kind, []):
            bag = (bag_dir / e["bag"]).resolve()
            frames, problem = check_bag(bag, need_depth=need_depth)
            out.append(
                BagEntry(
                    str(e["name"]),
                    bag,
                    frames or int(e.get("frames", 0)),
                    str(e.get("platform", "")),
                    str(e.get("environment", "")),
                    problem,
                )
            )
        return out

    return manifest, entries("clients", True), entries("test", True)


def robot_id_of(name: str) -> str:
    """A client's robot id: its name in the id alphabet (sorting the ids of a generated
    scenario keeps its client order, which the coordinator's aggregation order follows)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
