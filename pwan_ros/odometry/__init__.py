"""PWAN odometry (no ROS): preprocess, keyframe tracking, PWAN recovery, trust policy, keyframes,
motion model, and the REP-105 odometer the node publishes."""
