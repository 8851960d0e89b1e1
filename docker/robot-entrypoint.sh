#!/bin/bash
# Source ROS 2 and the fedepth_ros workspace, then run the command (default: robot.launch.py).
set -eo pipefail
# shellcheck disable=SC1090,SC1091
source "/opt/ros/${ROS_DISTRO}/setup.bash"
# shellcheck disable=SC1091
source /opt/fedepth/setup.bash
exec "$@"
