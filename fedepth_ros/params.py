"""The nodes' ROS parameters: names, defaults (as in config/*.yaml) and descriptions, ROS-free.

Each node declares exactly its spec with :func:`declare_parameters`; a test checks that every
``config/<node>.yaml`` holds the same names with the same values and types (ROS rejects a YAML
``10`` for a parameter declared as a double, so types matter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fedepth.recipe import TrainRecipe

_RECIPE = TrainRecipe()


class NodeConfigError(ValueError):
    """A parameter value the node cannot work with (logged as one line; exit status 1)."""


ParamSpec = Mapping[str, tuple[Any, str]]  # name -> (default, description)

BAG_PLAYER: ParamSpec = {
    "bag": ("", "rosbag2 directory, or a single .mcap / .db3 file"),
    "rate": (1.0, "playback rate factor (2.0 = twice as fast as recorded)"),
    "loop": (False, "restart from the start offset when the bag ends"),
    "start_offset": (0.0, "seconds into the bag to start from"),
    "topics": ("", "comma-separated bag topics to play; empty plays every topic"),
    "topic_prefix": ("", "namespace put in front of every published topic"),
    "absolute_topics": (False, "publish the recorded absolute names instead of relative ones"),
    "qos_depth": (10, "history depth of the (reliable, volatile) publishers"),
    "wait_for_subscribers": (0, "wait until every publisher has this many subscribers"),
    "wait_timeout": (10.0, "give up waiting for subscribers after this many seconds"),
    "start_delay": (0.0, "seconds to wait before the first message (after the subscriber wait)"),
    "ack_timeout": (
        5.0,
        "at the end, wait this long for subscribers to acknowledge everything (lossless: "
        "exit status 3 if they did not)",
    ),
    "lossless": (
        False,
        "keep every message until each subscriber acknowledged it (KEEP_ALL history: with "
        "lossless subscribers no frame is lost, the player is held back instead)",
    ),
}

ROBOT_NODE: ParamSpec = {
    "robot_id": ("robot1", "this robot's client id at the coordinator"),
    "coordinator": ("localhost:50051", "host:port of the fedepth coordinator (gRPC)"),
    "token_file": ("", "file holding this robot's credential token ('' = none)"),
    "tls_ca_file": ("", "PEM CA certificate of a TLS coordinator ('' = plaintext)"),
    "platform": (
        "",
        "label sent at Register, e.g. car, spot, falcon (the label-grouping baselines use it; "
        "'' = not sent)",
    ),
    "environment": ("", "label sent at Register, e.g. urban, forest, indoor ('' = not sent)"),
    "weights": (
        "",
        "initial safetensors weights with a model card, declared at Register and used for "
        "the descriptor ('' = the coordinator's card's model with the run's initial weights, "
        "downloaded)",
    ),
    "threads": (0, "torch CPU threads, set before the first forward (0 = torch's default)"),
    "buffer_size": (256, "frames kept in memory (drop-oldest)"),
    "frame_stride": (3, "keep every n-th synchronized frame"),
    "spill_dir": ("", "directory for frames evicted from memory ('' = no spill)"),
    "spill_size": (0, "frames kept on disk when spilling"),
    "descriptor_frames": (32, "frames sampled for the client descriptor"),
    # the fallback recipe's defaults are the recipe's own (fedepth.recipe.TrainRecipe)
    "local_steps": (
        _RECIPE.local_steps,
        "optimizer steps per round, only if the coordinator sends no training recipe",
    ),
    "batch_size": (
        _RECIPE.batch_size,
        "frames per step, only if the coordinator sends no training recipe",
    ),
    "lr": (_RECIPE.lr, "learning rate, only if the coordinator sends no training recipe"),
    "train_height": (
        0,
        "descriptor input is train_height x train_width (0 = as received); also the training "
        "size if the coordinator sends no training recipe",
    ),
    "train_width": (0, "see train_height"),
    "device": ("auto", "auto | cpu | cuda | cuda:N"),
    "sync_slop": (0.02, "seconds: largest image/depth stamp difference of a pair"),
    "sync_queue_size": (10, "per-stream queue of the image/depth synchronizer"),
    "status_period": (1.0, "seconds between status and diagnostics messages"),
    "input_qos": (
        "sensor_data",
        "QoS of image, depth and camera_info: sensor_data (best effort) | reliable | lossless "
        "(reliable, keep all: every frame of a lossless player reaches the buffer)",
    ),
    "join_frames": (
        0,
        "frames buffered before the robot registers and sends its descriptor (0 = "
        "descriptor_frames); a replay sets the bag's frame count",
    ),
    "descriptor_seed": (0, "seed of the frames sampled for the descriptor"),
}

DEPTH_NODE: ParamSpec = {
    "robot_id": ("robot1", "principal whose credentials the node routes with"),
    "weights": (
        "",
        "local safetensors weights with a model card: used alone when coordinator is '', and "
        "for the routing descriptor and until routed ('' = the coordinator's card's model with "
        "the run's initial weights, downloaded)",
    ),
    "coordinator": ("localhost:50051", "host:port of the coordinator ('' = local weights only)"),
    "token_file": ("", "file holding the credential token ('' = none)"),
    "tls_ca_file": ("", "PEM CA certificate of a TLS coordinator ('' = plaintext)"),
    "descriptor_frames": (16, "first n frames whose descriptor is routed"),
    "device": ("auto", "auto | cpu | cuda | cuda:N"),
    "threads": (1, "torch CPU threads, set before the first forward (0 = torch's default)"),
    "output_qos": (
        "sensor_data",
        "QoS of the outputs: sensor_data (best effort) | reliable | lossless (keep all)",
    ),
    "input_qos": (
        "sensor_data",
        "QoS of image and camera_info: sensor_data (best effort) | reliable | lossless",
    ),
    "answer_before_routed": (
        True,
        "with weights: answer frames with them while routing is pending (false: those frames "
        "wait and get the routed model's depth; the weights still give the routing descriptor)",
    ),
    "resize_input": (
        False,
        "run the model (and the routing descriptor) at the model card's input size, depth "
        "resized back to the image's size; false: at the image's own size",
    ),
    "publish_points": (False, "also publish depth_pred/points (PointCloud2, XYZ, camera frame)"),
    "mask_border": (
        [0.0, 0.0, 0.0, 0.0],
        "top, bottom, left, right: fractions of the image's height (top, bottom) and width "
        "(left, right) published as NaN (no depth), the margin where a model trained on "
        "ground truth reprojected from another sensor's view never had a target; each in "
        "[0, 0.5), all 0 = every pixel",
    ),
    "status_period": (1.0, "seconds between /diagnostics messages"),
    "queue_size": (2, "frames waiting for inference (drop-oldest)"),
    "follow_rounds": (
        True,
        "once routed, reload the routed clusters' models each time a round of the fleet "
        "closes, so that depth improves with the training (false: keep the first route's)",
    ),
    "follow_period": (5.0, "seconds between the checks for a closed round (follow_rounds)"),
    "reroute": (False, "re-route when the scene drifts (e.g. outdoors -> indoors)"),
    "reroute_window": (32, "frames in the sliding descriptor window"),
    "reroute_check_period": (8, "frames between drift checks"),
    "reroute_enter": (1.0, "drifting: window divergence from the routed descriptor > enter*tau"),
    "reroute_exit": (0.7, "hysteresis: back below exit * tau cancels a pending drift"),
    "reroute_patience": (3, "consecutive drifting checks before asking for a new route"),
    "reroute_cooldown": (10.0, "seconds after a re-route before the next one"),
}

DEPTH_SCORER: ParamSpec = {
    "bag": ("", "the sequence's bag: its /depth is the ground truth"),
    "out": ("", "JSON file the scores are written to (and <out>.npz, a picture's arrays)"),
    "expect": (0, "depth images to wait for (0 = one per frame of the bag)"),
    "timeout": (300.0, "seconds to wait for them before writing what arrived"),
    "eval_height": (0, "also score at eval_height x eval_width, as the benchmark does (0 = no)"),
    "eval_width": (0, "see eval_height"),
    "input_qos": (
        "lossless",
        "QoS of image and depth_pred/image: sensor_data | reliable | lossless",
    ),
}

NODE_PARAMETERS: Mapping[str, ParamSpec] = {
    "bag_player": BAG_PLAYER,
    "robot_node": ROBOT_NODE,
    "depth_node": DEPTH_NODE,
    "depth_scorer": DEPTH_SCORER,
}
NODE_CONFIG = {
    "bag_player": "bag_player.yaml",
    "robot_node": "robot.yaml",
    "depth_node": "depth.yaml",
    "depth_scorer": "depth_scorer.yaml",
}


class _Declares(Protocol):
    def declare_parameter(self, name: str, value: Any, descriptor: Any) -> Any: ...


def declare_parameters(node: _Declares, spec: ParamSpec) -> dict[str, Any]:
    """Declare every parameter of ``spec`` on an rclpy node; returns the resolved values.

    An override of another type than the default's (``-p rate:=2`` for a double, ``-p
    mask_border:=0.1`` for a list) raises NodeConfigError naming the parameter and the type.
    """
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.exceptions import InvalidParameterTypeException

    values: dict[str, Any] = {}
    for name, (default, text) in spec.items():
        try:
            declared = node.declare_parameter(name, default, ParameterDescriptor(description=text))
        except InvalidParameterTypeException as exc:
            raise NodeConfigError(
                f"{name} must be written like its default, {_ros_literal(default)} ({exc})"
            ) from None
        values[name] = declared.value
    return values


def _ros_literal(value: Any) -> str:
    """A parameter value as one writes it after ``-p name:=``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_ros_literal(v) for v in value) + "]"
    return repr(value)
