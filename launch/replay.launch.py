"""Replay a bag into a robot: bag_player and robot.launch.py in one namespace."""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PACKAGE = "fedepth_ros"


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare(PACKAGE)
    args = [
        DeclareLaunchArgument("bag", description="rosbag2 directory or .mcap / .db3 file"),
        DeclareLaunchArgument("rate", default_value="1.0", description="playback rate factor"),
        DeclareLaunchArgument(
            "loop", default_value="false", description="replay the bag in a loop"
        ),
        DeclareLaunchArgument(
            "start_offset", default_value="0.0", description="seconds into the bag to start"
        ),
        DeclareLaunchArgument(
            "player_params_file",
            default_value=PathJoinSubstitution([share, "config", "bag_player.yaml"]),
            description="bag_player parameters",
        ),
        DeclareLaunchArgument("namespace", default_value="", description="robot namespace"),
        DeclareLaunchArgument(
            "robot_id", default_value="robot1", description="client id at the coordinator"
        ),
        DeclareLaunchArgument(
            "coordinator",
            default_value="localhost:50051",
            description="host:port of the fedepth coordinator",
        ),
        DeclareLaunchArgument(
            "token_file",
            default_value="",
            description="file holding this robot's credential token",
        ),
        DeclareLaunchArgument(
            "use_depth_node", default_value="false", description="also run the live depth node"
        ),
    ]
    namespace = LaunchConfiguration("namespace")
    player = Node(
        package=PACKAGE,
        executable="bag_player",
        name="bag_player",
        namespace=namespace,
        output="screen",
        parameters=[
            LaunchConfiguration("player_params_file"),
            {
                "bag": ParameterValue(LaunchConfiguration("bag"), value_type=str),
                "rate": ParameterValue(LaunchConfiguration("rate"), value_type=float),
                "loop": ParameterValue(LaunchConfiguration("loop"), value_type=bool),
                "start_offset": ParameterValue(
                    LaunchConfiguration("start_offset"), value_type=float
                ),
                # the robot subscribes image, depth and camera_info: start once it listens
                "wait_for_subscribers": 1,
                "wait_timeout": 120.0,
            },
        ],
    )
    robot = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch", "robot.launch.py"])),
        launch_arguments={
            "namespace": namespace,
            "robot_id": LaunchConfiguration("robot_id"),
            "coordinator": LaunchConfiguration("coordinator"),
            "token_file": LaunchConfiguration("token_file"),
            "use_depth_node": LaunchConfiguration("use_depth_node"),
        }.items(),
    )
    return LaunchDescription([*args, player, robot])
