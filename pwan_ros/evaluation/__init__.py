"""Evaluation on bags: metrics, plots, replay over DDS, offline runs, LiDAR simulator, PCD to
bag."""
