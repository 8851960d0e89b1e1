"""``fedepth fleet replay``: a fleet benchmarked through the real ROS nodes, replaying bags.

ROS-free itself: it starts executables and watches them. For every method it starts a real
``fedepth-coordinator`` (the served model's card, the benchmark profile's training recipe, the
same initial weights as ``fedepth bench``), then for every client one ``robot_node`` fed by one
``bag_player`` replaying the client's bag, in the client's namespace, with at most
``max_robots`` robot processes alive at once (see :class:`Scheduler`), until the coordinator
has run every round. Then each test sequence's bag is played into a ``depth_node`` (routed by
the coordinator), whose every published depth image a ``depth_scorer`` scores against the
bag's depth. Results come out in the benchmark's format (results.json, report.md, figures via
:mod:`fedepth.bench`) plus the replay's own figures (frames, latency).

Loss-free mode (the default, ``lossless``): players, nodes and scorer use reliable KEEP_ALL QoS
end to end (:func:`fedepth_ros.node_common.stream_qos`), the player waits for the robot's
subscriptions before it plays and for its acknowledgements at the end, and the robot joins only
once every frame of its bag is buffered (``join_frames``), so it buffers exactly the frames
``fedepth bench`` trains on, registers the same sample count and computes the same descriptor.

State lives under ``OUT/state/<method>/`` (coordinator state, logs, scores): the same command
continues where an interrupted one stopped (a coordinator restarts from its durable state; the
robots re-join, which is idempotent; finished methods and scored sequences are kept).

The package: :mod:`.spec` (what runs), :mod:`.bags` (the bags and their manifest),
:mod:`.processes` (child processes), :mod:`.scheduler` (which robots run when),
:mod:`.inputs`, :mod:`.coordinator`, :mod:`.training` and :mod:`.testphase` (the phases of a
method's run), :mod:`.results` and :mod:`.report` (the outputs), :mod:`.driver`
(:class:`FleetReplay`, the whole command).
"""

from fedepth_ros.replay.bags import (
    BAGS_MANIFEST,
    BagEntry,
    check_bag,
    read_bags,
    robot_id_of,
    write_scenario_bags,
)
from fedepth_ros.replay.driver import FleetReplay
from fedepth_ros.replay.processes import Child, stop_all
from fedepth_ros.replay.report import replay_report, write_replay_figures
from fedepth_ros.replay.scheduler import Scheduler, robots_with_work
from fedepth_ros.replay.spec import OPERATOR, STATEFUL, ReplayError, ReplaySpec
from fedepth_ros.replay.training import RobotState

__all__ = [
    "BAGS_MANIFEST",
    "OPERATOR",
    "STATEFUL",
    "BagEntry",
    "Child",
    "FleetReplay",
    "ReplayError",
    "ReplaySpec",
    "RobotState",
    "Scheduler",
    "check_bag",
    "read_bags",
    "replay_report",
    "robot_id_of",
    "robots_with_work",
    "stop_all",
    "write_replay_figures",
    "write_scenario_bags",
]
