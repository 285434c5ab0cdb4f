"""Small simulated bags shared by the bag/replay/evaluation tests (the ``small_bag`` fixture of
conftest.py, generated per test module)."""

from pwan_ros.evaluation.lidar_sim import SimConfig, write_sim_bag

SMALL = dict(beams=8, azimuth_steps=360, moving_objects=2)


def make_small_bag(path, scans=6, **overrides):
    """A tiny rosbag2 (mcap): ``scans`` scans of ~2k points at 10 Hz + /ground_truth + /clock."""
    cfg = SimConfig(scans=scans, **{**SMALL, **overrides})
    write_sim_bag(path, cfg)
    return path
