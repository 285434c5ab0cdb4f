"""The README's main job end to end with the real node: simulated bag -> replay over DDS ->
pwan_odometry_node -> evaluation against the bag's ground truth."""
import json
import subprocess
import sys

import pytest


@pytest.mark.ros
def test_demo_with_real_node(tmp_path, ros_env):
    out = tmp_path / 'demo'
    # A slowed replay (0.3x) so a loaded CI machine answers every scan.
    proc = subprocess.run([sys.executable, '-m', 'pwan_ros.cli.demo', '--output', str(out),
                           '--scans', '20', '--rate', '0.3'],
                          env=ros_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f'summary: {out / "summary.json"}'
    summary = json.loads((out / 'summary.json').read_text())
    for key in ('scans', 'scans_dropped', 'median_latency_ms', 'ate_rmse_m', 'rpe_trans_pct',
                'rpe_rot_deg_per_m'):
        assert key in summary
    assert summary['scans'] >= 18, summary
    assert summary['ate_rmse_m'] < 0.05, summary
    assert summary['rpe_trans_pct'] < 2.0, summary
    assert summary['rpe_rot_deg_per_m'] < 0.2, summary
    assert (out / 'trajectory.png').stat().st_size > 10_000
    node_log = (out / 'node.log').read_text()
    assert 'Traceback' not in node_log, node_log[-3000:]
