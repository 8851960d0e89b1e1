"""The training phase: one ``robot_node`` and its ``bag_player`` per client, scheduled onto
the robot slots every poll until the coordinator has run every round; robots that die are
restarted or dropped."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedepth_coordinator.client import CoordinatorClient
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.simulate import CoordinatorProcess
from fedepth_ros.replay.bags import BagEntry
from fedepth_ros.replay.processes import Child, log_tail, node_cmd, ros_params, stop_all
from fedepth_ros.replay.scheduler import Scheduler, robots_with_work
from fedepth_ros.replay.spec import ReplayError
from fedepth_ros.replay.testphase import ReplayTestPhase

_POLL_S = 0.25


@dataclass
class RobotState:
    """What the driver knows of one robot over a method's run."""

    rid: str
    entry: BagEntry
    starts: int = 0
    failures: int = 0
    dropped_at: str | None = None
    peak_rss: list[int] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)


def failed_process(node: Child, player: Child) -> Child | None:
    """The process that failed a running robot: its ``robot_node`` if that exited, else its
    ``bag_player`` if that exited with a status (a lossless player that exits 3 did not
    deliver the bag, and the robot would wait for its frames forever: seen once in ~600
    starts); None while both are fine (a player that finished with 0 is)."""
    if not node.alive():
        return node
    return player if player.proc.poll() else None


class ReplayTraining(ReplayTestPhase):
    """The robots of a method's rounds."""

    def _robot_cmds(
        self, rid: str, entry: BagEntry, target: str, sdir: Path
    ) -> tuple[list[str], list[str]]:
        c, s = self.config, self.spec
        ns = ["--ros-args", "-r", f"__ns:=/{rid}"]
        qos = "lossless" if s.lossless else "sensor_data"
        robot = (
            node_cmd("robot_node")
            + ns
            + ros_params(
                {
                    "robot_id": rid,
                    "coordinator": target,
                    "token_file": str(sdir / "tokens" / f"{rid}.token"),
                    "platform": entry.platform,
                    "environment": entry.environment,
                    "threads": 1,
                    "buffer_size": max(1, entry.frames),
                    "frame_stride": 1,
                    "descriptor_frames": c.descriptor_frames,
                    "train_height": int(c.image_size[0]),
                    "train_width": int(c.image_size[1]),
                    "sync_queue_size": entry.frames + 10,
                    "input_qos": qos,
                    "join_frames": entry.frames if s.lossless else 0,
                    "descriptor_seed": c.seed,
                    # no weights: the robot downloads the run's initial model, the frozen
                    # encoder of the benchmark's descriptors, as a deployed robot does
                }
            )
        )
        player = (
            node_cmd("bag_player")
            + ns
            + ros_params(
                {
                    "bag": str(entry.bag),
                    "rate": s.rate,
                    "lossless": s.lossless,
                    "qos_depth": max(10, entry.frames),
                    "wait_for_subscribers": 1,
                    "wait_timeout": s.start_timeout_s,
                    "ack_timeout": 60.0,
                }
            )
        )
        return robot, player

    def _stop_robots(
        self,
        robots: dict[str, RobotState],
        running: dict[str, tuple[Child, Child]],
        rids: Sequence[str],
    ) -> None:
        """Stop several robots at once (each shutdown takes seconds; in parallel)."""
        procs = {rid: running.pop(rid) for rid in rids}
        stop_all([c for pair in procs.values() for c in pair])
        for rid, pair in procs.items():
            self._stop_robot(robots[rid], pair)

    def _stop_robot(self, robot: RobotState, procs: tuple[Child, Child]) -> None:
        node, player = procs
        robot.exits.append(node.stop())
        robot.peak_rss.append(node.peak_rss)
        player.stop(5.0)
        for child in procs:
            if child in self.children:
                self.children.remove(child)

    def _start_robot(self, robot: RobotState, target: str, sdir: Path) -> tuple[Child, Child]:
        robot.starts += 1
        robot_cmd, player_cmd = self._robot_cmds(robot.rid, robot.entry, target, sdir)
        logs = sdir / "logs"
        node = Child(robot.rid, robot_cmd, logs / f"{robot.rid}.robot.log", self.env, self.forks)
        player = Child(
            robot.rid, player_cmd, logs / f"{robot.rid}.player.log", self.env, self.forks
        )
        self.children += [node, player]
        return node, player

    def _rounds(
        self,
        method: str,
        sdir: Path,
        coordinator: CoordinatorProcess,
        op: CoordinatorClient,
        robots: dict[str, RobotState],
        running: dict[str, tuple[Child, Child]],
        restarts: list[int],
    ) -> list[Any]:
        s, c = self.spec, self.config
        sched = Scheduler(self.ids, s.max_robots)
        target = f"127.0.0.1:{coordinator.port}"
        pause = threading.Event()
        seen_rounds = -1
        restarted = [0]
        formed = False
        while True:
            status = self._status(op, coordinator, method, sdir, restarted)
            if status is None:
                pause.wait(_POLL_S)
                continue
            target = f"127.0.0.1:{coordinator.port}"
            if not formed and status.phase is not Phase.WAITING_FOR_FLEET:
                formed = True
                self.echo(f"{method}: fleet formed with {len(status.robots)} robots")
            for h in status.history[seen_rounds + 1 :]:
                alive = len(running)
                self.echo(
                    f"{method}: round {h.round + 1}/{c.rounds} closed ({h.closed_by}): "
                    f"{h.accepted}/{h.selected} updates, {h.duration_s:.1f} s; robot "
                    f"processes alive {alive}, restarts so far {restarts[0]}"
                )
                seen_rounds = h.round
            if status.phase is Phase.FINISHED:
                return list(status.history)
            work = robots_with_work(status)
            if "*enrol*" in work:  # not registered yet: everyone without a descriptor
                known = {r.robot_id for r in status.robots}
                work |= {rid for rid in self.ids if rid not in known}
            for rid, (node, player) in list(running.items()):
                node.sample_memory()
                failed = failed_process(node, player)
                if failed is None:
                    continue
                robot = robots[rid]
                code = failed.proc.returncode
                what = "its bag_player" if failed is player else "it"
                robot.failures += 1
                self._stop_robot(robot, running.pop(rid))
                log = failed.log
                if robot.failures > s.robot_retries:
                    robot.dropped_at = f"round {status.round}" if formed else "enrolment"
                    died = f"{method}: robot {rid}: {what} exited with status {code} again ({log})"
                    if not formed:  # the fleet forms with every robot: it never would
                        raise ReplayError(
                            f"{died} before the fleet formed, which needs all "
                            f"{len(self.ids)} robots; fix or remove its bag and rerun"
                        )
                    if s.round_deadline_s <= 0:  # the round would wait for it forever
                        raise ReplayError(
                            f"{died}; round {status.round + 1} cannot close without it: rerun "
                            "the same command with --round-deadline S (and --quorum Q) to go "
                            "on without it from the last finished round"
                        )
                    self.echo(f"{died}: a drop-out from {robot.dropped_at} on")
                else:
                    self.echo(
                        f"{method}: robot {rid}: {what} exited with status {code} ({log}):\n"
                        f"{log_tail(log, 6)}\nrestarting it"
                    )
            dropped = {rid for rid, r in robots.items() if r.dropped_at}
            start, stop = sched.decide(work, list(running), dropped)
            self._stop_robots(robots, running, stop)
            # fresh interpreters only: forked test nodes start in seconds, and 16 idle ones
            # took 0.6 of a core from the last round's robots (round 8: 261 s, not 145)
            if self.forks is None and status.round == c.rounds - 1 and not self._prestarted:
                self._prestart_tests(sdir, target)
            for rid in start:
                if robots[rid].starts:
                    restarts[0] += 1
                running[rid] = self._start_robot(robots[rid], target, sdir)
            pause.wait(_POLL_S)
