"""Scan-to-keyframe odometry pipeline (no ROS): filter, tracking, PWAN recovery, trust policy, keyframes, motion model."""
