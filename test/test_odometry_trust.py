"""The trust policy's verdicts (pwan_ros.odometry.trust): decided without changing its state."""

import copy

import numpy as np

from pwan_ros.odometry.config import OdometryConfig
from pwan_ros.odometry.keyframe_tracker import MatchQuality
from pwan_ros.odometry.keyframes import Keyframe
from pwan_ros.odometry.trust import TrustPolicy, Verdict

H = 0.5  # matching distance (m)


def policy_with_history(**config):
    """A policy that accepted five scans: matched ratio 0.9, residual 0.1 m, 1000 points, 0.02 m
    and 0.2 deg from the motion prediction."""
    trust = TrustPolicy(OdometryConfig(**config))
    for _ in range(5):
        trust.accepted(MatchQuality(0.9, 0.1), 1000, (0.02, 0.2))
    return trust


def keyframe(reference=False):
    return Keyframe(
        local_map=None, pose=np.eye(4), index=0 if reference else 1, is_reference=reference
    )


def test_judge_accepts_at_the_floor_and_rejects_below_it_with_the_reason():
    trust = policy_with_history()
    floor = trust.acceptance_floor()
    assert floor > trust.config.min_matched_ratio  # raised by the history
    assert trust.judge(MatchQuality(0.9, 0.1), '', (0.01, 0.1), H) == Verdict('accept')
    assert trust.judge(MatchQuality(floor, 0.1), 'note', None, H) == Verdict('accept', 'note')
    far = trust.judge(MatchQuality(floor - 0.05, 0.1), 'tracking lost', (5.0, 10.0), H)
    assert far.action == 'reject' and not far.by_motion
    assert far.reason == f'matched ratio {floor - 0.05:.2f} < required {floor:.2f} (tracking lost)'


def test_judge_accepts_a_low_match_that_agrees_with_the_motion_prediction():
    trust = policy_with_history()
    low = MatchQuality(trust.acceptance_floor() - 0.05, 0.1)
    verdict = trust.judge(low, '', (0.03, 0.3), H)
    assert verdict.action == 'accept' and verdict.by_motion
    assert 'agrees with the motion prediction (0.030 m, 0.30 deg)' in verdict.reason
    # no prediction, or a match under min_matched_ratio: rejected whatever the agreement
    assert trust.judge(low, '', None, H).action == 'reject'
    assert trust.judge(MatchQuality(0.1, 0.1), '', (0.03, 0.3), H).action == 'reject'
    # without a history nothing is known to agree with
    fresh = TrustPolicy(OdometryConfig())
    assert fresh.judge(MatchQuality(0.25, 0.1), '', (0.0, 0.0), H).action == 'reject'


def test_judge_of_a_deformation_uses_min_matched_ratio_alone():
    trust = policy_with_history()
    least = trust.config.min_matched_ratio
    assert trust.judge(MatchQuality(least, 0.1), '', None, H, deformed=True).action == 'accept'
    low = trust.judge(MatchQuality(least - 0.1, 0.1), '', None, H, deformed=True)
    assert low == Verdict(
        'reject', f'matched ratio {least - 0.1:.2f} < min_matched_ratio {least:.2f}'
    )


def test_screen_decides_first_scan_reanchor_and_collapse_before_registering():
    trust = policy_with_history(reanchor_after=2)
    assert trust.screen(None, 1000) == Verdict('init')
    assert trust.screen(keyframe(), 1000) is None
    collapsed = trust.screen(keyframe(), 100)
    assert collapsed == Verdict('reject', 'usable points collapsed (100 vs recent 1000)')
    trust.rejected()
    trust.rejected()
    verdict = trust.screen(keyframe(), 1000)
    assert verdict.action == 'reanchor' and 'after 2 rejected scans' in verdict.reason
    assert trust.screen(keyframe(reference=True), 1000) is None  # a reference is never left


def test_verdicts_leave_the_policy_unchanged():
    trust = policy_with_history(reanchor_after=2)
    trust.rejected()
    before = copy.deepcopy(vars(trust))
    for q in (MatchQuality(0.9, 0.1), MatchQuality(0.2, 0.3), MatchQuality(0.6, 0.1)):
        trust.judge(q, '', (0.03, 0.3), H)
        trust.judge(q, '', None, H, deformed=True)
    for kf in (None, keyframe(), keyframe(True)):
        trust.screen(kf, 100)
    after = vars(trust)
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in before if k != 'config')
