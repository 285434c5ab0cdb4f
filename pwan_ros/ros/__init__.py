"""ROS 2 nodes and their helpers: the only package modules that import rclpy (with the replay
tool)."""
