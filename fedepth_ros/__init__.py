"""fedepth_ros: ROS 2 nodes, thin adapters over the fedepth library and the coordinator client."""
