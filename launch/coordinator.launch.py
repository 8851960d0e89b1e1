"""Launch the fedepth coordinator (gRPC service) as a process next to the ROS graph.

The coordinator is not a ROS node (no --ros-args): it runs as a process, started from the
package's installed executable, <prefix>/lib/fedepth_ros/fedepth-coordinator (where colcon puts
every console script of this package, and where `ros2 run fedepth_ros fedepth-coordinator`
finds it), not from PATH.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare

PACKAGE = "fedepth_ros"
EXECUTABLE = "fedepth-coordinator"


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
            PathJoinSubstitution([FindPackagePrefix(PACKAGE), "lib", PACKAGE, EXECUTABLE]),
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
