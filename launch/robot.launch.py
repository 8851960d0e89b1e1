"""Launch a robot: robot_node (federated client) and depth_node (live depth), one namespace."""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PACKAGE = "fedepth_ros"


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare(PACKAGE)
    args = [
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
            "params_file",
            default_value=PathJoinSubstitution([share, "config", "robot.yaml"]),
            description="robot_node parameters",
        ),
        DeclareLaunchArgument(
            "depth_params_file",
            default_value=PathJoinSubstitution([share, "config", "depth.yaml"]),
            description="depth_node parameters",
        ),
        DeclareLaunchArgument(
            "use_depth_node", default_value="true", description="also run the live depth node"
        ),
        DeclareLaunchArgument(
            "image_topic", default_value="image", description="rgb8/bgr8 camera image topic"
        ),
        DeclareLaunchArgument(
            "depth_topic",
            default_value="depth",
            description="depth image topic (32FC1 metres or 16UC1 millimetres)",
        ),
        DeclareLaunchArgument(
            "camera_info_topic", default_value="camera_info", description="camera info topic"
        ),
        DeclareLaunchArgument(
            "depth_pred_topic",
            default_value="depth_pred/image",
            description="topic of the predicted depth (32FC1 metres)",
        ),
        DeclareLaunchArgument(
            "depth_pred_info_topic",
            default_value="depth_pred/camera_info",
            description="camera_info of the predicted depth (keep it the image topic's sibling)",
        ),
        DeclareLaunchArgument(
            "log_level", default_value="info", description="ROS log level of both nodes"
        ),
    ]
    namespace = LaunchConfiguration("namespace")
    coordinator = ParameterValue(LaunchConfiguration("coordinator"), value_type=str)
    token_file = ParameterValue(LaunchConfiguration("token_file"), value_type=str)
    log_level = ["--log-level", LaunchConfiguration("log_level")]
    robot_id = ParameterValue(LaunchConfiguration("robot_id"), value_type=str)
    robot_node = Node(
        package=PACKAGE,
        executable="robot_node",
        name="robot_node",
        namespace=namespace,
        output="screen",
        parameters=[
            LaunchConfiguration("params_file"),
            {
                "robot_id": robot_id,
                "coordinator": coordinator,
                "token_file": token_file,
            },
        ],
        remappings=[
            ("image", LaunchConfiguration("image_topic")),
            ("depth", LaunchConfiguration("depth_topic")),
            ("camera_info", LaunchConfiguration("camera_info_topic")),
        ],
        ros_arguments=log_level,
    )
    depth_node = Node(
        package=PACKAGE,
        executable="depth_node",
        name="depth_node",
        namespace=namespace,
        output="screen",
        condition=IfCondition(LaunchConfiguration("use_depth_node")),
        parameters=[
            LaunchConfiguration("depth_params_file"),
            {"robot_id": robot_id, "coordinator": coordinator, "token_file": token_file},
        ],
        remappings=[
            ("image", LaunchConfiguration("image_topic")),
            ("camera_info", LaunchConfiguration("camera_info_topic")),
            ("depth_pred/image", LaunchConfiguration("depth_pred_topic")),
            ("depth_pred/camera_info", LaunchConfiguration("depth_pred_info_topic")),
        ],
        ros_arguments=log_level,
    )
    return LaunchDescription([*args, robot_node, depth_node])
