"""Evaluation numbers checked against trajectories whose errors can be computed by hand."""

import json
import math

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pwan_ros.cli import evaluate as evaluate_cli
from pwan_ros.evaluation.metrics import SUMMARY_KEYS, EvalConfig, EvaluationError, evaluate
from pwan_ros.evaluation.offline import run_offline
from pwan_ros.evaluation.run_record import RunRecord
from pwan_ros.io.trajectory import (
    Trajectory,
    TrajectoryError,
    read_blocks,
    read_kitti,
    read_pose_file,
    read_tum,
    write_kitti,
    write_tum,
)

N = 21  # poses 1 m apart along x, 1 s apart


def line(n=N, t0=100.0):
    poses = np.tile(np.eye(4), (n, 1, 1))
    poses[:, 0, 3] = np.arange(n, dtype=float)
    return Trajectory(t0 + np.arange(n, dtype=float), poses)


def test_scale_drift_gives_two_percent():
    gt = line()
    est_poses = gt.poses.copy()
    est_poses[:, 0, 3] *= 1.02
    r = evaluate(Trajectory(gt.stamps, est_poses), gt)
    # relative translation error of any pair = 0.02 * distance -> 2 %; rotations exact
    assert r.rpe_trans_pct == pytest.approx(2.0, abs=1e-9)
    assert r.rpe_rot_deg_per_m == pytest.approx(0.0, abs=1e-9)
    assert r.rpe_trans_m == pytest.approx(0.02, abs=1e-12)
    # best rigid fit of 1.02*x onto x centres the line: residual 0.02*(x - mean), RMSE 0.02*std(x)
    assert r.ate_rmse_m == pytest.approx(0.02 * math.sqrt((N * N - 1) / 12.0), rel=1e-6)
    assert r.ate_max_m == pytest.approx(0.02 * (N - 1) / 2, rel=1e-6)
    assert r.matched == N and r.path_length_m == pytest.approx(N - 1)
    assert r.rpe_lengths_m == pytest.approx((2.0, 4.0, 6.0, 8.0, 10.0))
    # 'origin' alignment pins the first pose: error grows to 0.02 * 20 m at the end
    o = evaluate(Trajectory(gt.stamps, est_poses), gt, EvalConfig(align='origin'))
    assert o.ate_max_m == pytest.approx(0.4, rel=1e-9)


def test_roll_drift_gives_known_degrees_per_metre():
    gt = line()
    est_poses = gt.poses.copy()
    # rolling about the direction of motion does not change the relative translations
    est_poses[:, :3, :3] = Rotation.from_euler(
        'x', 0.5 * np.arange(N)[:, None], degrees=True
    ).as_matrix()
    r = evaluate(Trajectory(gt.stamps, est_poses), gt, EvalConfig(rpe_lengths=(5.0,)))
    assert r.rpe_rot_deg_per_m == pytest.approx(0.5, rel=1e-9)
    assert r.rpe_rot_deg == pytest.approx(0.5, rel=1e-9)
    assert r.rpe_trans_pct == pytest.approx(0.0, abs=1e-9)
    assert r.rpe_pairs == N - 5
    assert r.ate_rmse_m == pytest.approx(0.0, abs=1e-9)


def test_alignment_modes_and_association():
    gt = line()
    shifted = gt.poses.copy()
    shifted[:, :3, 3] += [3.0, 4.0, 0.0]
    est = Trajectory(gt.stamps, shifted)
    assert evaluate(est, gt, EvalConfig(align='none')).ate_rmse_m == pytest.approx(5.0)
    assert evaluate(est, gt, EvalConfig(align='se3')).ate_rmse_m == pytest.approx(0.0, abs=1e-9)
    assert evaluate(est, gt, EvalConfig(align='origin')).ate_rmse_m == pytest.approx(0.0, abs=1e-9)
    # every other pose, stamps 3 ms late: associated within max_dt, 11 matches
    sub = Trajectory(gt.stamps[::2] + 0.003, gt.poses[::2])
    r = evaluate(sub, gt)
    assert r.matched == 11 and r.ate_rmse_m == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(
        EvaluationError, match='no estimated pose has a ground-truth pose within 0.001'
    ):
        evaluate(sub, gt, EvalConfig(max_dt=0.001))
    with pytest.raises(EvaluationError, match='at least 2 poses'):
        evaluate(Trajectory(gt.stamps[:1], gt.poses[:1]), gt)
    with pytest.raises(ValueError, match='--align'):
        EvalConfig(align='sim3x')


def test_pose_files_round_trip(tmp_path):
    gt = line(5)
    rot = gt.poses.copy()
    rot[:, :3, :3] = Rotation.from_euler(
        'zyx', [[0.1 * k, -0.05 * k, 0.02] for k in range(5)]
    ).as_matrix()
    traj = Trajectory(gt.stamps + 0.123456789, rot)
    back = read_tum(write_tum(tmp_path / 'a.tum', traj))
    np.testing.assert_allclose(back.poses, traj.poses, atol=1e-8)
    np.testing.assert_allclose(back.stamps, traj.stamps, atol=1e-6)
    kitti = read_kitti(write_kitti(tmp_path / 'a.kitti', traj))
    np.testing.assert_allclose(kitti.poses, traj.poses, atol=1e-8)
    assert list(kitti.stamps) == [0, 1, 2, 3, 4]
    blocks = tmp_path / 'poses.csv'
    blocks.write_text(
        ''.join(
            ''.join(
                ','.join(f'{v:.9f}' for v in row) + ',\n'
                for row in np.vstack([p[:3], [0, 0, 0, s]])
            )
            for p, s in zip(traj.poses, traj.stamps)
        )
    )
    b = read_blocks(blocks)
    np.testing.assert_allclose(b.poses, traj.poses, atol=1e-8)
    np.testing.assert_allclose(b.stamps, traj.stamps, atol=1e-6)
    assert read_pose_file(blocks).poses.shape == (5, 4, 4)
    bad = tmp_path / 'bad.txt'
    bad.write_text('1 2 3\n')
    with pytest.raises(TrajectoryError, match='3 columns'):
        read_pose_file(bad)
    with pytest.raises(TrajectoryError, match='strictly increasing'):
        Trajectory([1.0, 1.0], np.tile(np.eye(4), (2, 1, 1)))


def test_cli_pose_files_writes_summary_plot_and_table(tmp_path, capsys):
    gt = line()
    est = gt.poses.copy()
    est[:, 0, 3] *= 1.02
    write_tum(tmp_path / 'gt.tum', gt)
    write_tum(tmp_path / 'est.tum', Trajectory(gt.stamps, est))
    out = tmp_path / 'eval'
    rc = evaluate_cli.main(
        [
            '--est',
            str(tmp_path / 'est.tum'),
            '--gt-file',
            str(tmp_path / 'gt.tum'),
            '--output',
            str(out),
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and lines[-1] == f'summary: {out / "summary.json"}'
    assert any(line.startswith('RPE drift') and '2.00 %' in line for line in lines)
    summary = json.loads((out / 'summary.json').read_text())
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary['rpe_trans_pct'] == pytest.approx(2.0) and summary['scans'] == N
    assert summary['scans_dropped'] is None and summary['median_latency_ms'] is None
    assert (out / 'trajectory.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert read_tum(out / 'trajectory_est.tum').poses.shape == (N, 4, 4)
    # --json prints the same summary as JSON
    rc = evaluate_cli.main(
        [
            '--est',
            str(tmp_path / 'est.tum'),
            '--gt-file',
            str(tmp_path / 'gt.tum'),
            '--output',
            str(out),
            '--json',
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0 and json.loads(text)['ate_rmse_m'] == summary['ate_rmse_m']
    # errors are one clear line and exit code 2
    rc = evaluate_cli.main(
        ['--est', str(tmp_path / 'missing.tum'), '--gt-file', str(tmp_path / 'gt.tum')]
    )
    assert rc == 2 and 'cannot read pose file' in capsys.readouterr().err


def test_poses_without_stamps_are_matched_only_line_by_line(tmp_path, capsys):
    """KITTI (or plain 4x4) poses carry no stamps: against a stamped estimate they are refused
    (before: their line numbers were taken as seconds and a 2 Hz estimate was paired with the
    wrong poses, exit 0); against each other they are matched line by line, with no duration."""
    gt = line()
    est = Trajectory(gt.stamps, gt.poses.copy())
    est.poses[:, 1, 3] += 0.1
    write_tum(tmp_path / 'est.tum', est)
    write_kitti(tmp_path / 'gt.txt', gt)
    write_kitti(tmp_path / 'est.txt', est)
    write_kitti(tmp_path / 'short.txt', Trajectory(gt.stamps[:-1], gt.poses[:-1]))
    kitti = read_pose_file(tmp_path / 'gt.txt')
    assert not kitti.stamped and read_pose_file(tmp_path / 'est.tum').stamped
    for est_file, gt_file, words in (
        ('est.tum', 'gt.txt', 'the estimate has stamps but the ground truth has none'),
        ('est.txt', 'est.tum', 'the ground truth has stamps but the estimate has none'),
        ('short.txt', 'gt.txt', 'the estimate has 20 and the ground truth 21'),
    ):
        rc = evaluate_cli.main(
            [
                '--est',
                str(tmp_path / est_file),
                '--gt-file',
                str(tmp_path / gt_file),
                '--output',
                str(tmp_path / 'x'),
            ]
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and words in err[0], (est_file, gt_file, err)
    assert not (tmp_path / 'x').exists()
    res = evaluate(read_pose_file(tmp_path / 'est.txt'), kitti, EvalConfig(align='none'))
    assert res.matched == N and res.duration_s is None
    assert res.ate_rmse_m == pytest.approx(0.1)
    rc = evaluate_cli.main(
        [
            '--est',
            str(tmp_path / 'est.txt'),
            '--gt-file',
            str(tmp_path / 'gt.txt'),
            '--output',
            str(tmp_path / 'k'),
        ]
    )
    assert rc == 0 and f'over {N} poses (no stamps)' in capsys.readouterr().out
    # plain homogeneous 4x4 matrices (every corner 1) have no stamps either
    blocks = tmp_path / 'plain.csv'
    blocks.write_text(
        ''.join(' '.join(f'{v:g}' for v in row) + '\n' for p in gt.poses for row in p)
    )
    plain = read_pose_file(blocks)
    assert not plain.stamped and list(plain.stamps) == list(range(N))
    np.testing.assert_allclose(plain.poses, gt.poses)


def test_bad_tum_lines_are_named(tmp_path):
    """A repeated stamp (one of the two poses would be dropped unseen: before, the first was
    kept, an outlier gave a 16 m ATE with exit 0), a non-finite number or a zero quaternion:
    refused naming the file and line."""
    good = '0.0 0 0 0 0 0 0 1\n1.0 1 0 0 0 0 0 1\n2.0 2 0 0 0 0 0 1\n'
    cases = {
        'repeat': (good + '1.0 100 0 0 0 0 0 1\n', 'stamp 1 repeats on lines 2, 4'),
        'nan': (good + '3.0 nan 0 0 0 0 0 1\n', 'repeat.tum'),
        'zeroq': (good + '3.0 3 0 0 0 0 0 0\n', ':4: zero quaternion'),
        'short': (good + '3.0 3 0 0 0 0 1\n', ':4: 7 numbers; TUM lines need 8'),
    }
    cases['nan'] = (cases['nan'][0], ':4: non-finite numbers')
    for name, (text, words) in cases.items():
        path = tmp_path / f'{name}.tum'
        path.write_text(text)
        with pytest.raises(TrajectoryError) as err:
            read_pose_file(path)
        assert str(path) in str(err.value) and words in str(err.value), (name, err.value)


@pytest.mark.filterwarnings('error::RuntimeWarning')
def test_pose_files_keep_map_coordinates_exactly(tmp_path):
    """A trajectory in UTM-like metres (4.5e6 m north, millimetre steps): TUM and KITTI files give
    back the translations bit for bit (9 significant digits rounded them to 1 cm)."""
    poses = np.tile(np.eye(4), (4, 1, 1))
    poses[:, :3, 3] = np.array([512345.678, 4498765.4321, 123.456]) + 0.001 * np.arange(4)[:, None]
    traj = Trajectory(np.arange(4.0), poses)
    back = read_tum(write_tum(tmp_path / 'utm.tum', traj))
    np.testing.assert_array_equal(back.poses[:, :3, 3], poses[:, :3, 3])
    kitti = read_kitti(write_kitti(tmp_path / 'utm.kitti', traj))
    np.testing.assert_array_equal(kitti.poses, poses)


def test_static_ground_truth_reports_null_drift_and_strict_json(tmp_path, capsys):
    """A ground truth that never moves has no path: RPE per metre is undefined (null), with no
    numpy warnings, and the --json output and summary.json are strict JSON."""
    still = Trajectory(100.0 + np.arange(5.0), np.tile(np.eye(4), (5, 1, 1)))
    moved = still.poses.copy()
    moved[:, 0, 3] = 0.01 * np.arange(5)
    write_tum(tmp_path / 'gt.tum', still)
    write_tum(tmp_path / 'est.tum', Trajectory(still.stamps, moved))
    out = tmp_path / 'eval'
    rc = evaluate_cli.main(
        ['--est', str(tmp_path / 'est.tum'), '--gt-file', str(tmp_path / 'gt.tum')]
        + ['--output', str(out), '--json']
    )
    text = capsys.readouterr().out

    def strict(token):
        raise AssertionError(f'{token} in the JSON output')

    printed = json.loads(text, parse_constant=strict)  # stdout is the JSON alone
    saved = json.loads((out / 'summary.json').read_text(), parse_constant=strict)
    assert rc == 0 and printed == saved
    assert saved['path_length_m'] == 0.0 and saved['rpe_lengths_m'] == []
    assert saved['rpe_trans_pct'] is None and saved['rpe_rot_deg_per_m'] is None
    assert saved['rpe_trans_m'] == pytest.approx(0.01)


def test_offline_run_and_run_record(tmp_path, small_bag):
    """Offline mode on a generated bag: an estimator with a known 5 % scale error."""
    from pwan_ros.io.bags import read_trajectory

    gt = read_trajectory(small_bag, '/ground_truth')
    lookup = {round(s, 6): p for s, p in zip(gt.stamps, gt.poses)}
    calls = []

    def estimate(xyz, stamp):
        calls.append(xyz.shape)
        rel = np.linalg.inv(gt.poses[0]) @ lookup[round(stamp, 6)]
        rel[:3, 3] *= 1.05
        return None if len(calls) == 3 else rel  # the third scan is "dropped"

    run = run_offline(small_bag, estimate)
    assert run.scans_published == 6 and run.scans == 5 and run.scans_dropped == 1
    assert all(s[1] == 3 and s[0] > 1000 for s in calls)
    assert len(run.latencies_ms) == 6 and run.mode == 'offline'
    loaded = RunRecord.load(run.save(tmp_path / 'run'))
    np.testing.assert_allclose(loaded.estimate.poses, run.estimate.poses, atol=1e-8)
    assert loaded.scans_dropped == 1
    r = evaluate(loaded.estimate, gt)
    # translations scaled by 1.05: relative errors are 5 % of the chord, chord ~ path on this short
    # bit
    assert 4.8 < r.rpe_trans_pct <= 5.0 + 1e-6
    assert r.rpe_rot_deg_per_m == pytest.approx(0.0, abs=1e-4)


def test_cli_estimate_from_recorded_bag(tmp_path, small_bag, capsys):
    """--est may be a bag with /odometry (e.g. from ros2 bag record); scans are counted from
    --bag."""
    from pwan_ros.io import bags as bag_io

    gt = bag_io.read_trajectory(small_bag, '/ground_truth')
    with bag_io.BagWriter(tmp_path / 'est_bag') as w:
        for s, p in list(zip(gt.stamps, gt.poses))[1:]:
            ns = int(round(s * 1e9))
            w.write(
                '/odometry',
                ns,
                bag_io.odometry(ns, np.linalg.inv(gt.poses[0]) @ p, 'odom', 'base_link'),
            )
    out = tmp_path / 'eval'
    rc = evaluate_cli.main(
        ['--est', str(tmp_path / 'est_bag'), '--bag', str(small_bag), '--output', str(out)]
    )
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / 'summary.json').read_text())
    assert (summary['scans'], summary['scans_dropped'], summary['matched']) == (5, 1, 5)
    assert summary['ate_rmse_m'] < 1e-6


def test_cli_recorded_bag_takes_the_corrected_poses(tmp_path, small_bag, capsys):
    """A bag recorded from the node during a recovery: /odometry holds predictions 2 m off for
    two scans, /pwan_odometry/corrected_odometry their final poses; the evaluation takes those
    (``--corrected-topic ''``: the live poses)."""
    from pwan_ros.io import bags as bag_io

    gt = bag_io.read_trajectory(small_bag, '/ground_truth')
    off = np.eye(4)
    off[0, 3] = 2.0
    with bag_io.BagWriter(tmp_path / 'est_bag') as w:
        for k, (s, p) in enumerate(zip(gt.stamps, gt.poses)):
            ns, pose = int(round(s * 1e9)), np.linalg.inv(gt.poses[0]) @ p
            live = pose @ off if k in (3, 4) else pose
            w.write('/odometry', ns, bag_io.odometry(ns, live, 'odom', 'base_link'))
            if k in (3, 4):
                topic = '/pwan_odometry/corrected_odometry'
                w.write(topic, ns + 1, bag_io.odometry(ns, pose, 'odom', 'base_link'))
    ate = {}
    for corrected in (None, ''):
        out = tmp_path / f'eval{corrected}'
        extra = [] if corrected is None else ['--corrected-topic', corrected]
        argv = ['--est', str(tmp_path / 'est_bag'), '--bag', str(small_bag), '--output', str(out)]
        assert evaluate_cli.main(argv + extra) == 0, capsys.readouterr().err
        ate[corrected] = json.loads((out / 'summary.json').read_text())['ate_rmse_m']
    assert ate[None] < 1e-6 < 0.1 < ate['']


def test_track_losses_and_side_by_side_comparison(tmp_path):
    """A run whose pose jumps 0.5 m at one scan and keeps the offset lost track exactly there;
    the comparison table and plot show every run, a skipped one with its reason."""
    from pwan_ros.evaluation.compare import (
        format_comparison,
        plot_comparison,
        skipped_run,
        summarise_run,
    )
    from pwan_ros.evaluation.metrics import track_losses

    gt = line()
    est = gt.poses.copy()
    est[12:, 1, 3] += 0.5  # sideways jump at the 13th pose, kept afterwards
    turned = gt.poses.copy()
    turned[5:, :3, :3] = Rotation.from_euler(
        'z', 3.0, degrees=True
    ).as_matrix()  # 3 deg heading error
    assert track_losses(evaluate(Trajectory(gt.stamps, est), gt)).tolist() == [gt.stamps[12]]
    assert track_losses(evaluate(Trajectory(gt.stamps, turned), gt)).tolist() == [gt.stamps[5]]
    assert len(track_losses(evaluate(gt, gt))) == 0
    good = RunRecord(
        estimate=gt, scans_published=N, latencies_ms=[10.0, 30.0, 20.0], pwan_stamps=[gt.stamps[3]]
    )
    bad = RunRecord(estimate=Trajectory(gt.stamps, est), scans_published=N + 2, latencies_ms=[5.0])
    runs = [
        summarise_run('adaptive', 'PWAN adaptive', good, gt),
        summarise_run('tracking_only', 'tracking', bad, gt),
        skipped_run('kiss_icp', 'KISS-ICP', 'not installed (pip install kiss-icp)'),
    ]
    m = runs[0].metrics()
    assert (m['scans'], m['scans_published'], m['scans_pwan_engaged'], m['scans_lost_track']) == (
        N,
        N,
        1,
        0,
    )
    assert (m['median_latency_ms'], m['max_latency_ms']) == (20.0, 30.0)
    assert runs[1].metrics()['scans_lost_track'] == 1 and runs[1].metrics()['ate_rmse_m'] > 0.1
    assert runs[2].metrics() == {'skipped': 'not installed (pip install kiss-icp)'}
    table = format_comparison(runs).splitlines()
    assert len(table) == 5 and 'PWAN engaged' in table[0] and 'lost track' in table[0]
    assert table[2].split()[:5] == ['PWAN', 'adaptive', f'{N}/{N}', '1', '0']
    assert table[3].split()[:4] == ['tracking', f'{N}/{N + 2}', '0', '1']
    assert 'skipped: not installed' in table[4]
    png = plot_comparison(runs, gt, tmp_path / 'cmp.png', [('blackout', 5.0, 6.0)], title='t')
    assert png.stat().st_size > 10_000 and not list(tmp_path.glob('*.tmp*'))
