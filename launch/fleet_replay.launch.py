"""A fleet replay on a ROS install: per client namespace a bag_player and a robot_node, or per
test sequence a bag_player, a routed depth_node and a depth_scorer, from a replay's bags.json.

The bags and their ``bags.json`` are the ones ``fedepth fleet replay`` writes (OUT/bags); the
coordinator runs apart (coordinator.launch.py, or the one a replay started) and every robot's
token is ``<tokens_dir>/<robot id>.token`` (a robot id is the client name in the id alphabet).
Loss-free as the command: reliable keep-all QoS end to end, robots join once every frame of
their bag is buffered. ``phase:=train`` starts every client at once (a launch file does not
schedule: use ``fedepth fleet replay --max-robots N`` for fleets larger than the machine);
``phase:=test`` replays the test sequences into depth nodes once the run has finished.
"""

import json
import re
from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, GroupAction, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node, PushRosNamespace
from launch_ros.substitutions import FindPackageShare

PACKAGE = "fedepth_ros"


def _robot_id(name):
    # fedepth_ros.replay.bags.robot_id_of's rule (importing that package here would load the
    # whole replay driver into the launch process)
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


def _player(share, bag, rate, frames, *, subscribers, topics=None):
    """A loss-free bag_player of ``bag``: keep-all reliable QoS, starts once ``subscribers``
    subscribe to each topic, waits for their acknowledgements at the end."""
    params = {
        "bag": bag,
        "rate": rate,
        "lossless": True,
        "qos_depth": max(10, frames),
        "wait_for_subscribers": subscribers,
        "wait_timeout": 600.0,
        "ack_timeout": 60.0,
    }
    if topics is not None:
        params["topics"] = topics
    return Node(
        package=PACKAGE,
        executable="bag_player",
        name="bag_player",
        output="screen",
        parameters=[PathJoinSubstitution([share, "config", "bag_player.yaml"]), params],
    )


def _fleet(context):
    share = FindPackageShare(PACKAGE)
    bags_dir = Path(LaunchConfiguration("bags_dir").perform(context))
    manifest = json.loads((bags_dir / "bags.json").read_text(encoding="utf-8"))
    coordinator = LaunchConfiguration("coordinator").perform(context)
    tokens = Path(LaunchConfiguration("tokens_dir").perform(context))
    rate = float(LaunchConfiguration("rate").perform(context))
    height = int(LaunchConfiguration("train_height").perform(context))
    width = int(LaunchConfiguration("train_width").perform(context))
    weights = LaunchConfiguration("weights").perform(context)
    frames_for_descriptor = int(LaunchConfiguration("descriptor_frames").perform(context))
    phase = LaunchConfiguration("phase").perform(context)
    groups = []
    if phase == "train":
        for entry in manifest["clients"]:
            rid = _robot_id(entry["name"])
            frames = int(entry["frames"])
            player = _player(share, str(bags_dir / entry["bag"]), rate, frames, subscribers=1)
            robot = Node(
                package=PACKAGE,
                executable="robot_node",
                name="robot_node",
                output="screen",
                parameters=[
                    PathJoinSubstitution([share, "config", "robot.yaml"]),
                    {
                        "robot_id": rid,
                        "coordinator": coordinator,
                        "token_file": str(tokens / f"{rid}.token"),
                        "platform": entry.get("platform", ""),
                        "environment": entry.get("environment", ""),
                        "threads": 1,
                        "buffer_size": max(1, frames),
                        "frame_stride": 1,
                        "descriptor_frames": frames_for_descriptor,
                        "train_height": height,
                        "train_width": width,
                        "sync_queue_size": frames + 10,
                        "input_qos": "lossless",
                        "join_frames": frames,
                        "weights": weights,
                    },
                ],
            )
            groups.append(GroupAction([PushRosNamespace(rid), player, robot]))
    else:
        for i, entry in enumerate(manifest["test"]):
            ns = f"test{i:03d}"
            frames = int(entry["frames"])
            bag = str(bags_dir / entry["bag"])
            depth = Node(
                package=PACKAGE,
                executable="depth_node",
                name="depth_node",
                output="screen",
                parameters=[
                    PathJoinSubstitution([share, "config", "depth.yaml"]),
                    {
                        "robot_id": f"test-{i:03d}",
                        "coordinator": coordinator,
                        "token_file": str(tokens / f"test-{i:03d}.token"),
                        "descriptor_frames": max(1, min(frames, frames_for_descriptor)),
                        "threads": 1,
                        "output_qos": "lossless",
                        "input_qos": "lossless",
                        "resize_input": True,
                        "queue_size": frames + 1,
                        "weights": weights,
                        "answer_before_routed": False,
                    },
                ],
            )
            scorer = Node(
                package=PACKAGE,
                executable="depth_scorer",
                name="depth_scorer",
                output="screen",
                parameters=[
                    PathJoinSubstitution([share, "config", "depth_scorer.yaml"]),
                    {
                        "bag": bag,
                        "out": str(
                            Path(LaunchConfiguration("scores_dir").perform(context))
                            / f"{entry['name']}.json"
                        ),
                        "eval_height": height,
                        "eval_width": width,
                        "input_qos": "lossless",
                    },
                ],
            )
            # the depth node and the scorer both subscribe; the depth stays in the bag (scoring)
            player = _player(share, bag, rate, frames, subscribers=2, topics="/image,/camera_info")
            groups.append(GroupAction([PushRosNamespace(ns), depth, scorer, player]))
    return groups


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "bags_dir", description="directory with bags.json (fedepth fleet replay's OUT/bags)"
        ),
        DeclareLaunchArgument(
            "phase",
            default_value="train",
            description="train: a player and a robot per client; test: a player, a routed "
            "depth_node and a depth_scorer per test sequence",
        ),
        DeclareLaunchArgument(
            "coordinator",
            default_value="localhost:50051",
            description="host:port of the fedepth coordinator",
        ),
        DeclareLaunchArgument(
            "tokens_dir", description="directory holding <robot id>.token and test-NNN.token"
        ),
        DeclareLaunchArgument(
            "scores_dir", default_value="scores", description="where the scorers write JSON"
        ),
        DeclareLaunchArgument(
            "weights",
            default_value="",
            description="optional local copy of the served initial weights (a card-carrying "
            "safetensors); empty: every node downloads the run's initial model from the "
            "coordinator, the descriptors' frozen encoder",
        ),
        DeclareLaunchArgument("rate", default_value="20.0", description="playback rate factor"),
        DeclareLaunchArgument(
            "train_height", default_value="64", description="the recipe's input height"
        ),
        DeclareLaunchArgument(
            "train_width", default_value="96", description="the recipe's input width"
        ),
        DeclareLaunchArgument(
            "descriptor_frames", default_value="32", description="frames of a descriptor"
        ),
    ]
    return LaunchDescription([*args, OpaqueFunction(function=_fleet)])
