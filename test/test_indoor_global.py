"""Slow tests of the global search on real indoor RGB-D fragments (../shared/data/rigid/
indoor_3dmatch, 3DMatch with its ground truth). They fail (never skip) when the data is missing.
Right = the benchmark's registration recall test: within 15 deg and 0.3 m of the truth."""

import json
import pathlib

import numpy as np
import pytest

from pwan_ros.cli.register import main
from pwan_ros.core import RegistrationConfig, register
from pwan_ros.geometry.se3 import invert, rotation_angle

ROOT = pathlib.Path(__file__).resolve().parents[1]
INDOOR = ROOT.parent / 'shared' / 'data' / 'rigid' / 'indoor_3dmatch'


def fragments(name: str, outliers: float = 0.0) -> tuple:
    """(source, reference with ``outliers`` x its points uniform in its box (seed 0), truth)."""
    folder = INDOOR / name
    assert folder.is_dir(), f'real data missing: {folder} (see ../shared/data/README.md)'
    src, ref = np.load(folder / 'src.npy'), np.load(folder / 'ref.npy')
    rng = np.random.default_rng(0)
    extra = rng.uniform(ref.min(0), ref.max(0), (int(outliers * len(ref)), 3))
    return src, np.vstack((ref, extra)), np.loadtxt(folder / 'gt.txt')


def errors(pose: np.ndarray, truth: np.ndarray) -> tuple:
    d = invert(truth) @ pose
    return float(np.degrees(rotation_angle(d))), float(np.linalg.norm(d[:3, 3]))


@pytest.mark.slow
def test_a_room_with_as_many_outliers_is_right_or_refused_through_the_cli(tmp_path, capsys):
    """hotel_uc 18->10 with 100 % uniform outliers: before, `pwan_register --global` came back
    ok 91 deg off (the pose explained 27 % of the source beyond chance, the truth 63 %; no
    feature match backed it)."""
    src, ref, truth = fragments('3dmatch_hotel_uc_18to10', 1.0)
    np.save(tmp_path / 'src.npy', src)
    np.save(tmp_path / 'ref.npy', ref)
    rc = main([str(tmp_path / 'src.npy'), str(tmp_path / 'ref.npy'), '--global', '--json', '-q'])
    out = json.loads(capsys.readouterr().out)
    rot, trans = errors(np.array(out['transform']), truth)
    assert (rc == 0 and rot < 15 and trans < 0.3) or (rc == 3 and out['status'] == 'refused'), (
        rc,
        rot,
        trans,
        out['reason'],
    )


@pytest.mark.slow
def test_a_scaled_or_moved_copy_gets_the_same_verdict_and_pose():
    """hotel_uc 18->10 in metres, x0.1, x10, moved by one similarity into [-1, 1]^3 and 1e5 m
    out: the same verdict (ok, right), and poses that agree within 0.5 deg and two point
    spacings once the scaling is undone."""
    src, ref, truth = fragments('3dmatch_hotel_uc_18to10')
    middle = ref.mean(axis=0)
    unit = 1.0 / np.abs(np.vstack((src, ref)) - middle).max()
    poses = []
    for scale, shift in ((1.0, 0.0), (0.1, 0.0), (10.0, 0.0), (unit, -unit * middle), (1.0, 1e5)):
        res = register(
            src * scale + shift, ref * scale + shift, RegistrationConfig(verbose=False), 'global'
        )
        frame = np.diag([scale, scale, scale, 1.0])
        frame[:3, 3] = shift
        pose = np.linalg.inv(frame) @ res.transform @ frame
        assert res.status == 'ok', (scale, shift, res.reason)
        rot, trans = errors(pose, truth)
        assert rot < 15 and trans < 0.3, (scale, shift, rot, trans)
        poses.append(pose)
    for pose in poses[1:]:
        rot, trans = errors(pose, poses[0])
        assert rot < 0.5 and trans < 2 * 0.015, (rot, trans)  # the fragments' spacing: 1.5 cm


@pytest.mark.slow
@pytest.mark.parametrize(
    'name,outliers',
    [('3dmatch_lab_hj_10to0', 0.0), ('3dmatch_home_at_29to8', 1.0)],
)
def test_a_right_pose_in_a_real_room_is_accepted(name, outliers):
    """Before, both right poses were refused: lab_hj as 'ambiguous' against a runner-up 0.25 away
    that the fine-tune on subsets had left short of the same fit; home_at with 100 % outliers
    because it put 37 % of the source on the reference beyond chance (< confirm_below) and few
    feature matches backed it."""
    src, ref, truth = fragments(name, outliers)
    res = register(src, ref, RegistrationConfig(verbose=False), 'global')
    rot, trans = errors(res.transform, truth)
    assert res.status == 'ok' and rot < 15 and trans < 0.3, (res.status, rot, trans, res.reason)


@pytest.mark.slow
def test_the_low_overlap_pair_is_solved_or_refused_for_its_overlap():
    """3DLoMatch hotel1 32->11 (23 % overlap): right, or refused with a reason that names the
    little overlap (before: 'a pose 0.534 away explains the data almost as well')."""
    src, ref, truth = fragments('3dlomatch_hotel1_32to11')
    res = register(src, ref, RegistrationConfig(verbose=False), 'global')
    rot, trans = errors(res.transform, truth)
    if res.status == 'ok':
        assert rot < 15 and trans < 0.3, (rot, trans)
    else:
        assert 'overlap' in res.reason and 'init' in res.reason, res.reason


@pytest.mark.slow
def test_the_default_mode_warns_only_of_the_pose_it_returns(tmp_path, capsys):
    """home_at 29->8 (a 150 deg turn) through `pwan_register` without --global: the local fit
    from identity creeps 300 fine-tune iterations from a wrong pose and stops at the cap, then
    the global search's pose replaces it. The answer is right and its own fine-tune converged:
    before, the user was still told to raise finetune.max_iterations."""
    src, ref, truth = fragments('3dmatch_home_at_29to8')
    np.save(tmp_path / 'src.npy', src)
    np.save(tmp_path / 'ref.npy', ref)
    rc = main([str(tmp_path / 'src.npy'), str(tmp_path / 'ref.npy'), '--json', '-q'])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    rot, trans = errors(np.array(out['transform']), truth)
    assert rc == 0 and rot < 15 and trans < 0.3, (rc, rot, trans, out['reason'])
    assert 'max_iterations' not in captured.err, captured.err
