"""Input/output: PointCloud2 codec, point and pose files, rosbag2 bags, atomic writes."""
