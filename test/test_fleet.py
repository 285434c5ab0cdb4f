"""Fleet evaluation: sequences as users have them (KITTI folders, scan folders, bags), the
product's pipeline offline, many (sequence, method) runs in parallel on a local Ray."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import assert_one_line_failure, cli_main
from pwan_ros.evaluation.fleet import Task, run_task
from pwan_ros.evaluation.methods import Method
from pwan_ros.evaluation.lidar_sim import SimConfig, simulate
from pwan_ros.evaluation.sequences import SequenceSource, write_kitti_sequence
from pwan_ros.geometry.se3 import invert
from pwan_ros.io.trajectory import read_kitti, read_tum

DATA = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data' / 'lidar'
BIN = pathlib.Path(sys.executable).parent
#: KITTI odometry sequence 00's calib.txt ``Tr`` (T_cam0_velodyne)
TR_00 = np.array(
    [
        [4.276802385584e-04, -9.999672484946e-01, -8.084491683471e-03, -1.198459927713e-02],
        [-7.210626507497e-03, 8.081198471645e-03, -9.999413164504e-01, -5.403984729748e-02],
        [9.999738645903e-01, 4.859485810390e-04, -7.206933692422e-03, -2.921968648686e-01],
        [0.0, 0.0, 0.0, 1.0],
    ]
)


def write_kitti(root: pathlib.Path, scans, stamps, lidar_poses, official=False):
    """A KITTI sequence with sequence 00's Tr (poses.txt inside, or KITTI's own
    dataset/poses/NAME.txt with ``official``); the lidar ground truth T_lidar0_lidar."""
    poses = root.parent.parent / 'poses' / f'{root.name}.txt' if official else None
    write_kitti_sequence(root, scans, stamps, lidar_poses, TR_00, poses)
    return invert(lidar_poses[0]) @ np.asarray(lidar_poses)


@pytest.fixture(scope='module')
def sim_kitti(tmp_path_factory):
    """Two simulated drives as KITTI sequences in KITTI's own layout (dataset/sequences/NN,
    dataset/poses/NN.txt): (their folders, their lidar ground truth T_lidar0_lidar)."""
    root = tmp_path_factory.mktemp('kitti') / 'dataset' / 'sequences'
    folders, truths = [], []
    for seed in (0, 1):
        cfg = SimConfig(
            scans=8, beams=8, azimuth_steps=360, moving_objects=2, seed=seed, stress=False
        )
        sim = [s for s in simulate(cfg) if not s.blackout]
        scans = [np.c_[s.xyz, s.extras['intensity']] for s in sim]
        stamps = 0.1 * np.arange(len(sim))
        folder = root / f'{seed:02d}'
        truths.append(write_kitti(folder, scans, stamps, [s.pose for s in sim], official=True))
        folders.append(folder)
    return folders, truths


def test_a_kitti_sequence_reads_in_the_lidar_frame(sim_kitti, tmp_path):
    """Scans, stamps and the ground truth of a KITTI folder: camera-0 poses turned into the
    lidar's with calib.txt's Tr; found in the folder or in KITTI's dataset/poses; a folder
    without poses runs without ground truth; a broken one is one line naming the file."""
    (folder, _), (truth, _) = sim_kitti
    src = SequenceSource('kitti', str(folder))
    assert src.name == '00' and src.count() == 8
    gt = src.ground_truth()
    np.testing.assert_allclose(gt.poses, truth, atol=1e-9)
    np.testing.assert_allclose(gt.stamps, 0.1 * np.arange(8))
    first = next(src.scans())
    raw = np.fromfile(folder / 'velodyne' / '000000.bin', dtype=np.float32).reshape(-1, 4)
    assert first.frame == 'velodyne' and first.stamp == 0.0
    np.testing.assert_array_equal(first.xyz, raw[:, :3])
    np.testing.assert_array_equal(first.extras['intensity'], raw[:, 3])
    # poses.txt inside the folder is found as well; none: no ground truth
    inside = tmp_path / 'seq'
    rel = write_kitti(inside, [raw] * 3, [0.0, 0.1, 0.2], [np.eye(4)] * 3)
    np.testing.assert_allclose(
        SequenceSource("kitti", str(inside)).ground_truth().poses, rel, atol=1e-9
    )
    (inside / 'poses.txt').unlink()
    assert SequenceSource('kitti', str(inside)).ground_truth() is None
    (inside / 'times.txt').write_text('0.0\n0.1\n')
    with pytest.raises(ValueError, match='times.txt: 2 increasing stamps expected one per scan'):
        list(SequenceSource('kitti', str(inside)).scans())


def test_bad_fleet_inputs_are_one_line(tmp_path, capfd, sim_kitti):
    """Checked before any run: a variant the odometry does not have or of the wrong type, a
    variant without pwan, an estimator twice or unknown, a --scans folder without its pose file,
    a KITTI folder without scans or with a pose missing, a sequence twice, one --gt-file for two
    sequences: one line, exit 2, nothing written."""
    folder = sim_kitti[0][0]
    out = tmp_path / 'out'
    short = tmp_path / 'short'
    write_kitti(short, [np.zeros((5, 4))] * 3, [0.0, 0.1, 0.2], [np.eye(4)] * 3)
    (short / 'poses.txt').write_text((short / 'poses.txt').read_text().split('\n', 1)[1])
    two = ['--kitti', folder, sim_kitti[0][1]]
    for args, words in (
        (['--kitti', folder, '--variant', 'no_such_param=1'], 'no_such_param'),
        (['--kitti', folder, '--variant', 'scan_voxel_size'], 'expected name=value'),
        (['--kitti', folder, '--variant', 'scan_voxel_size=[1'], "'[1' is not a float"),
        (['--kitti', folder, '--variant', 'seed=2', '--estimator', 'icp'], 'add pwan'),
        (['--kitti', folder, '--estimator', 'pwan,pwan'], 'each once'),
        (['--kitti', folder, '--estimator', 'pwan,bogus'], 'module:factory'),
        (['--scans', folder], '1 --scans folders but 0 --poses files'),
        (['--kitti', tmp_path], 'no velodyne/*.bin scans'),
        (['--kitti', folder, folder], 'given twice'),
        ([*two, '--gt-file', folder.parent.parent / 'poses' / '00.txt'], 'give one'),
        ([*two, short], 'poses.txt: 2 poses for 3 scans'),
    ):
        proc = cli_main(capfd, 'pwan_evaluate', '--offline', *args, '--output', out)
        assert_one_line_failure(proc, 2, [words])
        assert not out.exists()


def alone(capfd, tmp_path, name, sequence_args, estimator='pwan', extra=()):
    """The summary of one sequence run alone, in this process (no Ray)."""
    out = tmp_path / 'alone' / name / estimator
    args = ['--offline', *sequence_args, '--estimator', estimator, '--max-scans', '6']
    proc = cli_main(capfd, 'pwan_evaluate', *args, *extra, '--output', out)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / 'summary.json').read_text()), out


@pytest.mark.heavy
def test_sequences_in_parallel_on_ray_equal_each_run_alone(tmp_path, capfd, sim_kitti):
    """Simulated KITTI folders and the real nuScenes and BALM sequences, the product's pipeline
    and KISS-ICP side by side, on a local Ray of 2 workers: every number of the aggregate equals
    the same sequence run alone; a sequence that fails is reported (exit 1) and the others kept;
    --resume keeps what is complete and runs only the rest."""
    nus, balm = DATA / 'nuscenes_keyframes', DATA / 'balm_seq_a'
    broken = tmp_path / 'broken'
    write_kitti(broken, [np.zeros((5, 4))] * 2, [0.0, 0.1], [np.eye(4)] * 2)
    (broken / 'velodyne' / '000001.bin').write_bytes(b'\0' * 7)  # not float32 rows
    inputs = ['--kitti', *sim_kitti[0], broken]
    inputs += ['--scans', nus / 'scans', balm, '--poses', nus / 'poses.txt']
    inputs += [balm / 'alidarPose.csv', '--rate-hz', '2']
    out = tmp_path / 'fleet'
    cmd = [BIN / 'pwan_evaluate', '--offline', *inputs, '--estimator', 'pwan,kiss_icp']
    cmd += ['--max-scans', '6', '--workers', '2', '--output', out]
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert 'Ray: 10 tasks on 2 CPUs (local)' in proc.stderr
    assert 'Traceback' not in proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if ln.startswith('pwan_evaluate:')]
    assert len(failed) == 2 and all('broken' in ln and 'SequenceError' in ln for ln in failed)
    agg = json.loads((out / 'aggregate.json').read_text())
    assert [f['sequence'] for f in agg['failed']] == ['broken', 'broken']
    assert len(agg['rows']) == 8 and (out / 'aggregate.png').stat().st_size > 0
    assert '| **mean** (4 runs) | pwan |' in proc.stdout
    rows = {(r['sequence'], r['method']): r for r in agg['rows']}
    cases = [
        ('00', ['--kitti', sim_kitti[0][0]]),
        (
            'nuscenes_keyframes',
            ['--scans', nus / 'scans', '--poses', nus / 'poses.txt', '--rate-hz', '2'],
        ),
        ('balm_seq_a', ['--scans', balm, '--poses', balm / 'alidarPose.csv']),
    ]
    for name, args in cases:
        for estimator in ('pwan', 'kiss_icp'):
            summary, folder = alone(capfd, tmp_path, name, args, estimator)
            row = rows[(name, estimator)]
            for key in ('ate_rmse_m', 'rpe_trans_m', 'rpe_rot_deg', 'rpe_trans_pct'):
                same = summary[key] is None or row[key] == pytest.approx(summary[key], rel=1e-9)
                assert same and (row[key] is None) == (summary[key] is None), (name, key)
            assert row['scans'] == summary['scans'] == 6
            fleet = out / name / estimator
            np.testing.assert_allclose(
                read_tum(fleet / 'trajectory_est.tum').poses,
                read_tum(folder / 'trajectory_est.tum').poses,
                rtol=0,
                atol=1e-9,
            )
            # the KITTI file in the pose file's convention: camera 0's for a KITTI sequence
            kitti = read_kitti(fleet / 'trajectory_est.kitti').poses
            tum = read_tum(fleet / 'trajectory_est.tum').poses
            if name == '00':
                tum = TR_00 @ tum @ np.linalg.inv(TR_00)
            np.testing.assert_allclose(kitti, tum, atol=1e-9)
    # the exact parameters of a pwan run: a ROS 2 parameter file the node takes
    params = yaml.safe_load((out / '00' / 'pwan' / 'config.yaml').read_text())
    assert params['pwan_odometry']['ros__parameters']['mode'] == 'adaptive'
    # the pipeline is the product's: good on the real sequences (ATE within their GT's accuracy)
    assert rows[('balm_seq_a', 'pwan')]['ate_rmse_m'] < 0.05
    assert rows[('nuscenes_keyframes', 'pwan')]['ate_rmse_m'] < 0.3

    # --resume: the complete runs are kept (not rerun), a removed one is run again, in process
    done = out / '00' / 'pwan' / 'summary.json'
    kept = (out / 'balm_seq_a' / 'pwan' / 'summary.json').stat().st_mtime_ns
    done.unlink()
    proc = cli_main(
        capfd,
        'pwan_evaluate',
        '--offline',
        *inputs[:3],
        '--scans',
        balm,
        '--poses',
        balm / 'alidarPose.csv',
        '--estimator',
        'pwan,kiss_icp',
        '--max-scans',
        '6',
        '--workers',
        '1',
        '--resume',
        '--output',
        out,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count('complete, kept (--resume)') == 5
    assert '[1/1] 00 / pwan' in proc.stderr and done.is_file()
    assert (out / 'balm_seq_a' / 'pwan' / 'summary.json').stat().st_mtime_ns == kept


@pytest.mark.heavy
def test_variants_and_the_params_file_reach_the_pipeline(tmp_path, capfd, sim_kitti):
    """--params (the node's parameter file, its node among others) and each --variant make
    their own run of the pipeline beside the plain one; values read as their parameter's type
    (deskew=off stays the text 'off'; 5e-1 a number); a folder name safe from a value with '/';
    the run's config.yaml holds the exact parameters it ran with."""
    params = tmp_path / 'node.yaml'
    mine = {'ros__parameters': {'mode': 'tracking', 'seed': 3}}
    params.write_text(yaml.safe_dump({'pwan_odometry': mine, 'other': {'ros__parameters': {}}}))
    out = tmp_path / 'out'
    proc = cli_main(
        capfd,
        'pwan_evaluate',
        '--offline',
        '--kitti',
        sim_kitti[0][0],
        '--params',
        params,
        '--variant',
        'scan_voxel_size=0.3',
        '--variant',
        'scan_voxel_size=6e-1,local_map_keyframes=2,deskew=off',
        '--variant',
        'odom_frame=../up',
        '--max-scans',
        '4',
        '--workers',
        '1',
        '--output',
        out,
    )
    assert proc.returncode == 0, proc.stderr
    labels = [
        'pwan',
        'pwan[scan_voxel_size=0.3]',
        'pwan[scan_voxel_size=0.6,local_map_keyframes=2,deskew=off]',
        'pwan[odom_frame=../up]',
    ]
    folders = labels[:3] + ['pwan[odom_frame=.._up]']
    for folder, voxel in zip(folders, (0.0, 0.3, 0.6, 0.0)):
        ran = yaml.safe_load((out / '00' / folder / 'config.yaml').read_text())
        values = ran['pwan_odometry']['ros__parameters']
        assert (values['mode'], values['seed'], values['scan_voxel_size']) == (
            'tracking',
            3,
            voxel,
        )
        assert json.loads((out / '00' / folder / 'summary.json').read_text())['scans'] == 4
        assert values['deskew'] == ('off' if voxel == 0.6 else 'auto')
    assert values['odom_frame'] == '../up' and not (tmp_path / 'up]').exists()
    agg = json.loads((out / 'aggregate.json').read_text())
    assert [m['method'] for m in agg['means']] == labels


def test_the_pipeline_offline_reads_the_node_s_frames(tmp_path, small_bag):
    """A bag's scans in the sensor frame with base_frame set: the static transform comes from
    the bag's /tf_static, as the node looks it up; without it the run says which is missing."""
    task = Task(
        SequenceSource('bag', str(small_bag)),
        Method('pwan'),
        str(tmp_path / 'run'),
        {'base_frame': 'chassis'},
    )
    with pytest.raises(ValueError, match='no static transform chassis <- base_link'):
        run_task(task, raise_errors=True)


def test_without_ray_the_runs_go_one_after_another(tmp_path, sim_kitti, monkeypatch):
    """Ray is an optional extra: without it, --workers 2 says so once and runs the tasks in
    this process, in order; --address without Ray is refused."""
    from pwan_ros.evaluation.parallel import run_tasks

    monkeypatch.setitem(sys.modules, 'ray', None)  # as if not installed
    tasks = [
        Task(SequenceSource('kitti', str(f)), Method('pwan'), str(tmp_path / f.name), max_scans=3)
        for f in sim_kitti[0]
    ]
    said = []
    results = run_tasks(tasks, workers=2, log=said.append)
    assert [r.sequence for r in results] == ['00', '01'] and all(r.ok for r in results)
    assert said[0].startswith('Ray is not installed') and said.count(said[0]) == 1
    assert len(said) == 5 and (said[1], said[3]) == ('[1/2] 00 / pwan ...', '[2/2] 01 / pwan ...')
    assert said[2].startswith('[1/2] 00 / pwan: ATE ') and ', 3/3 scans' in said[2]
    with pytest.raises(
        ValueError, match=r"--address needs Ray: pip install 'pwan_ros\[cluster\]'"
    ):
        run_tasks(tasks, address='auto', log=said.append)


@pytest.mark.heavy
def test_a_shared_sequence_as_a_kitti_folder_gives_the_same_run(tmp_path, capfd):
    """The real nuScenes scans as a KITTI folder (float32 .bin, times.txt, calib Tr, poses in
    camera 0's frame) and as the .npy folder they ship in: the same poses and metrics."""
    nus = DATA / 'nuscenes_keyframes'
    lidar = read_kitti(nus / 'poses.txt').poses[:6]
    scans = [np.load(nus / 'scans' / f'{k:06d}.npy') for k in range(6)]
    seq = tmp_path / 'nus_kitti'
    write_kitti(seq, [np.c_[s, np.zeros(len(s))] for s in scans], 0.5 * np.arange(6), lidar)
    as_kitti, out_k = alone(capfd, tmp_path, 'kitti', ['--kitti', seq])
    as_npy, out_n = alone(
        capfd,
        tmp_path,
        'npy',
        ['--scans', nus / 'scans', '--poses', nus / 'poses.txt', '--rate-hz', '2'],
    )
    for key in ('ate_rmse_m', 'rpe_trans_m', 'rpe_rot_deg', 'path_length_m'):
        assert as_kitti[key] == pytest.approx(as_npy[key], rel=1e-6), key
    np.testing.assert_allclose(
        read_tum(out_k / 'trajectory_est.tum').poses,
        read_tum(out_n / 'trajectory_est.tum').poses,
        atol=1e-9,
    )


def test_resume_keeps_only_the_same_run_and_a_failed_run_leaves_no_folder(tmp_path, sim_kitti):
    """--resume keeps a folder whose summary names the same sequence, method and scan limit; a
    changed limit or a broken summary runs again; a fleet task that fails leaves no folder (an
    earlier complete one stays until a run replaces it)."""
    from pwan_ros.evaluation.parallel import run_tasks

    def tasks(max_scans, seqs=sim_kitti[0]):
        return [
            Task(
                SequenceSource('kitti', str(f)),
                Method('pwan'),
                str(tmp_path / 'out' / f.name),
                max_scans=max_scans,
                owned=True,
            )
            for f in seqs
        ]

    said = []
    assert all(r.ok for r in run_tasks(tasks(3), workers=1, log=said.append))
    (tmp_path / 'out' / '01' / 'summary.json').write_text('{}')
    again = run_tasks(tasks(3), workers=1, resume=True, log=said.append)
    assert [r.resumed for r in again] == [True, False] and again[1].ok
    longer = run_tasks(tasks(4), workers=1, resume=True, log=said.append)
    assert [r.resumed for r in longer] == [False, False]
    assert [r.summary['scans'] for r in longer] == [4, 4]
    broken = tmp_path / 'broken'
    write_kitti(broken, [np.zeros((5, 4))] * 2, [0.0, 0.1], [np.eye(4)] * 2)
    (broken / 'velodyne' / '000001.bin').write_bytes(b'\0' * 7)
    (failed,) = run_tasks(tasks(0, [broken]), workers=1, log=said.append)
    assert not failed.ok and 'not a KITTI scan' in failed.error
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == ['00', '01']
