"""``fedepth fleet replay`` itself (:class:`FleetReplay`): every method (its coordinator, its
rounds, its test sequences, its summary), then the outputs; Ctrl-C and SIGTERM stop every
child and leave the state resumable."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

from fedepth.runstate import write_json_atomic
from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_ros.replay.processes import Child, stop_all
from fedepth_ros.replay.results import ReplayResults
from fedepth_ros.replay.spec import OPERATOR, STATEFUL
from fedepth_ros.replay.training import RobotState


class FleetReplay(ReplayResults):
    """One ``fedepth fleet replay``: every method, then results, report and figures."""

    def run_method(self, method: str) -> dict[str, Any]:
        s = self.spec
        sdir = self.out / "state" / method
        done = sdir / "summary.json"
        if done.is_file():
            self.echo(f"{method}: finished earlier ({sdir}); kept")
            return dict(json.loads(done.read_text(encoding="utf-8")))
        sdir.mkdir(parents=True, exist_ok=True)
        if method in STATEFUL and s.max_robots < len(self.ids):
            self.echo(
                f"warning: {method}'s robots keep state between rounds, which a restarted robot "
                "process loses; with --max-robots below the fleet the run is not the benchmark's"
            )
        tests = [f"test-{i:03d}" for i in range(len(self.tests))]
        tokens = self._tokens(sdir, [*self.ids, *tests, OPERATOR])
        coordinator = self._coordinator(method, sdir)
        port = coordinator.start(timeout_s=s.start_timeout_s)
        target = f"127.0.0.1:{port}"
        self.echo(f"{method}: coordinator on {target} (state {sdir / 'coordinator'})")
        robots = {rid: RobotState(rid, e) for rid, e in zip(self.ids, self.clients, strict=True)}
        running: dict[str, tuple[Child, Child]] = {}
        restarts = [0]
        t_start = time.perf_counter()
        op = CoordinatorClient(open_channel(target), OPERATOR, tokens[OPERATOR])
        try:
            history = self._rounds(method, sdir, coordinator, op, robots, running, restarts)
            t_rounds = time.perf_counter() - t_start
            self._stop_robots(robots, running, list(running))
            scores = self._test_sequences(method, sdir, target, coordinator, tests)
        finally:
            self._stop_robots(robots, running, list(running))
            for pair in self._prestarted.values():
                stop_all(list(pair))
            self._prestarted = {}
            op.close()
            coordinator.stop()
        summary = self._summary(method, sdir, robots, history, scores, t_rounds, restarts[0])
        write_json_atomic(done, summary)
        return summary

    # -- everything --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Every method, then the outputs. SIGTERM is handled like Ctrl-C: every child is
        stopped, the state stays resumable."""

        def on_term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        main_thread = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, on_term) if main_thread else None
        try:
            self.prepare()
            summaries = {m: self.run_method(m) for m in self.spec.methods}
        finally:
            self.close()
            if main_thread:
                signal.signal(signal.SIGTERM, old)
        return self.write(summaries)

    def close(self) -> None:
        """Stop every child still running (Ctrl-C, an error): the state stays resumable."""
        stop_all(self.children)
        self.children = []
        if self.forks is not None:
            self.forks.close()
