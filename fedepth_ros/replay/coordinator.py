"""A method's coordinator process: throwaway loopback credentials, the gRPC benchmark's
configuration, and its fleet status (a coordinator that died is restarted from its state)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_coordinator.config import config_from_dict
from fedepth_coordinator.domain import FleetStatus
from fedepth_coordinator.simulate import CoordinatorProcess
from fedepth_ros.replay.inputs import ReplayInputs
from fedepth_ros.replay.spec import OPERATOR, ReplayError

_NO_DEADLINE_S = 30 * 24 * 3600.0


class ReplayCoordinator(ReplayInputs):
    """The replay's coordinator: credentials, configuration, status."""

    def _tokens(self, sdir: Path, names: Sequence[str]) -> dict[str, str]:
        """Throwaway loopback credentials of this method's run, kept for a resumed run."""
        path = sdir / "tokens.json"
        creds = sdir / "credentials.yaml"
        if path.is_file() and creds.is_file():
            tokens: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
            if set(names) <= set(tokens):
                return tokens
        creds.unlink(missing_ok=True)
        tokens = {}
        for n in names:
            tokens[n] = add_principal(creds, n, "operator" if n == OPERATOR else "robot")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(tokens, f)
        tdir = sdir / "tokens"
        tdir.mkdir(exist_ok=True)
        for n, t in tokens.items():
            (tdir / f"{n}.token").write_text(t, encoding="utf-8")
        return tokens

    def _coordinator(self, method: str, sdir: Path) -> CoordinatorProcess:
        c, s = self.config, self.spec
        n = len(self.ids)
        recipes = {c.recipe(r) for r in range(c.rounds)}
        if len(recipes) != 1:
            raise ReplayError("the recipe changes between rounds; the coordinator sends one")
        deadline = s.round_deadline_s if s.round_deadline_s > 0 else _NO_DEADLINE_S
        cfg = config_from_dict(
            {
                "server": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "max_workers": max(32, 2 * n + 8),
                    "max_wait_s": 5.0,
                    "grace_s": 1.0,
                },
                "auth": {"credentials_file": str(sdir / "credentials.yaml")},
                "rounds": {
                    "num_rounds": c.rounds,
                    "min_robots": n,
                    "fraction": 1.0,
                    "quorum": s.quorum if s.round_deadline_s > 0 else 1.0,
                    "deadline_s": deadline,
                    "seed": c.seed,
                },
                "strategy": {"name": method, "params": dict(c.method_params.get(method, {}))},
                "training": recipes.pop().to_dict(),
                "model": {"initial_weights": str(self.initial_path)},
                "validation": {"max_descriptor_dim": 8192, "max_summary_bytes": 1 << 22},
                "state": {"dir": str(sdir / "coordinator"), "backend": "sqlite"},
                "log_level": "INFO",
            }
        )
        return CoordinatorProcess(cfg, log_path=sdir / "coordinator.log")

    def _status(
        self,
        op: CoordinatorClient,
        coordinator: CoordinatorProcess,
        method: str,
        sdir: Path,
        restarted: list[int],
    ) -> FleetStatus | None:
        """The fleet status; a coordinator that died is restarted from its state (once)."""
        proc = coordinator.proc
        if proc is not None and proc.poll() is not None:
            code = proc.returncode
            if restarted[0] >= self.spec.coordinator_restarts:
                raise ReplayError(
                    f"{method}: the coordinator exited with status {code} again; see "
                    f"{coordinator.log_path}. Its state is kept: the same command resumes"
                )
            restarted[0] += 1
            self.echo(
                f"{method}: the coordinator exited with status {code} (see "
                f"{coordinator.log_path}); restarting it from its state on the same port"
            )
            coordinator.start(port=coordinator.port, timeout_s=self.spec.start_timeout_s)
        try:
            return op.fleet_status()
        except CoordinatorCallError:
            return None
