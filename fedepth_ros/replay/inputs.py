"""The replay's inputs: the bags (written from a scenario or given), the benchmark profile's
recipe, and the initial weights served with their model card."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedepth.bench import BenchSpec, sim_config
from fedepth.bench.inputs import ensure_weights
from fedepth.sim import SimConfig
from fedepth_ros.replay.bags import read_bags, robot_id_of, write_scenario_bags
from fedepth_ros.replay.processes import Child, NodeForkServer
from fedepth_ros.replay.spec import ReplayError, ReplaySpec


class ReplayInputs:
    """The inputs of one replay (:meth:`prepare`) and the driver's environment for its children."""

    def __init__(self, spec: ReplaySpec, echo: Callable[[str], None] = print) -> None:
        self.spec = spec
        self.echo = echo
        self.out = spec.out.resolve()
        self.env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, self.env.get("PYTHONPATH")) if p
        )
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.children: list[Child] = []
        #: nodes are forked from one interpreter that imported them (None: fresh ones)
        self.forks = NodeForkServer() if spec.fork_nodes else None
        self._prestarted: dict[int, tuple[Child, Child]] = {}
        self.t0 = time.perf_counter()

    # -- inputs ------------------------------------------------------------------------------
    def prepare(self) -> None:
        s = self.spec
        self.out.mkdir(parents=True, exist_ok=True)
        if s.bag_dir is not None:
            bag_dir = s.bag_dir.resolve()
        else:
            assert s.scenario_dir is not None
            bag_dir = self.out / "bags"
            self.echo(f"writing the scenario's bags into {bag_dir} (kept for later runs)")
            write_scenario_bags(s.scenario_dir, bag_dir)
        self.bag_dir = bag_dir
        manifest, clients, tests = read_bags(bag_dir)
        self.manifest = manifest
        self.missing: list[str] = []
        for e in clients + tests:
            if e.problem:
                self.echo(f"{e.name}: {e.problem}: left out of the replay")
                self.missing.append(f"{e.name}: {e.problem}")
        self.clients = [e for e in clients if not e.problem]
        self.tests = [e for e in tests if not e.problem]
        if len(self.clients) < 1:
            raise ReplayError(f"{bag_dir}: no usable client bag")
        scenario = str(manifest.get("scenario") or "hpe")
        profile = str(manifest.get("profile") or "small")
        seed = int(manifest.get("seed", 0))
        self.config: SimConfig = sim_config(
            scenario,
            profile,
            model=s.backbone,
            seed=seed,
            rounds=s.rounds,
            local_steps=s.local_steps,
            image_size=s.image_size,
        )
        self.scenario, self.profile, self.seed = scenario, profile, seed
        self.ids = [robot_id_of(e.name) for e in self.clients]
        if len(set(self.ids)) != len(self.ids):
            raise ReplayError("two clients have the same robot id after sanitizing their names")
        if self.ids != sorted(self.ids):
            self.echo(
                "note: the clients' order is not their ids' order; the coordinator aggregates "
                "in id order, so numbers may differ from `fedepth bench` in the last digits"
            )
        self.weights = self._weights()
        self._initial_file()

    def _weights(self) -> Path:
        s = self.spec
        if s.weights is not None:
            return s.weights.resolve()
        data = s.scenario_dir or Path(str(self.manifest.get("scenario_dir", "")))
        if not (data / "manifest.json").is_file():
            raise ReplayError(
                "the initial weights come from pretraining on the scenario: give --weights "
                "with --bags whose manifest names no scenario directory"
            )
        from fedepth.data.scenario import load_scenario

        spec = BenchSpec(
            scenario=self.scenario,
            profile=self.profile,
            methods=self.spec.methods,
            out=self.out,
            sim=self.config,
            data_dir=data,
            cache_dir=s.cache_dir,
            progress=s.progress,
        )
        scenario = load_scenario(data)
        try:
            return ensure_weights(spec, scenario).resolve()
        finally:
            scenario.close()

    def _initial_file(self) -> None:
        """The served weights with their model card (as the gRPC benchmark serves them)."""
        from safetensors.numpy import save_file

        from fedepth.models import get_state
        from fedepth.models.card import CARD_KEY, card_of
        from fedepth.sim import initial_model

        c = self.config
        model = initial_model(c, str(self.weights))
        self.initial = {k: np.asarray(v, order="C") for k, v in get_state(model).items()}
        self.state_bytes = int(sum(v.nbytes for v in self.initial.values()))
        card = card_of(model, input_size=(int(c.image_size[0]), int(c.image_size[1])))
        self.initial_path = self.out / "initial.safetensors"
        save_file(self.initial, str(self.initial_path), metadata={CARD_KEY: card.to_json()})
