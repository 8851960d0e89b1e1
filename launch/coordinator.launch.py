"""Launch the fedepth coordinator (gRPC service) as a process next to the ROS graph."""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import (
    EnvironmentVariable,
    FindExecutable,
    LaunchConfiguration,
    PathJoinSubstitution,
)
from launch_ros.substitutions import FindPackageShare

PACKAGE = "fedepth_ros"


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "config",
            default_value=PathJoinSubstitution(
                [FindPackageShare(PACKAGE), "config", "coordinator.yaml"]
            ),
            description="coordinator configuration (strategy, rounds, credentials)",
        ),
        DeclareLaunchArgument("port", default_value="50051", description="gRPC port to listen on"),
        DeclareLaunchArgument(
            "state_dir",
            default_value=PathJoinSubstitution(
                [EnvironmentVariable("HOME"), ".fedepth", "coordinator"]
            ),
            description="directory for the coordinator's SQLite state and model blobs",
        ),
    ]
    coordinator = ExecuteProcess(
        name="coordinator",
        cmd=[
            FindExecutable(name="fedepth-coordinator"),
            "--config",
            LaunchConfiguration("config"),
            "--port",
            LaunchConfiguration("port"),
            "--state-dir",
            LaunchConfiguration("state_dir"),
        ],
        output="screen",
        sigterm_timeout="10",
    )
    return LaunchDescription([*args, coordinator])
