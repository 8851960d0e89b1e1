"""fedepth_ros: ROS 2 nodes of fedepth, thin adapters over the fedepth library and its coordinator client."""
