"""The safeguard's linear source-only candidate: logistic regression (scikit-learn) beside the
source-only network, chosen by the held-out labelled rows; its model.ts; resume; summary."""

import json
import pathlib
import sys
import warnings

import numpy as np
import pytest
import torch

from pwan_ros.adaptation import AdaptConfig, AdaptTrainer, FeatureSet, run_adaptation
from pwan_ros.adaptation.deploy import load_classifier
from pwan_ros.adaptation.linear import LinearSource
from pwan_ros.adaptation.runner import export_torchscript
from pwan_ros.adaptation.safeguard import (
    CheckVerdict,
    ModelCheck,
    SafeguardDecision,
    adapt_with_safeguard,
    apply_check,
    consider_linear,
)
from pwan_ros.cli.adapt import main as adapt_main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_adapt_core import SYN, gaussian_domains  # noqa: E402

#: networks that cannot learn (lr 1e-8: the weights stay at their seeded initialisation, the same
#: on every CPU) on linearly separable classes: logistic regression is far better, and a quarter
#: of the rows held out shows it (16 rows to 1)
FROZEN = dict(
    SYN,
    lr=1e-8,
    steps=60,
    warmup_steps=20,
    eval_interval=20,
    checkpoint_interval=20,
    holdout_fraction=0.25,
)


def xor_domains(seed=0, d=4, n_per=60, sigma=0.5):
    """4 classes that no linear model separates: class c at +m_c and -m_c (half its rows each;
    m = (3, 3), (3, -3), (6, 6), (6, -6) in the first two of d dimensions); unlabelled: classes 0
    and 1, shifted by 0.3 and with fresh noise."""
    rng = np.random.default_rng(seed)
    centres = np.array([[3, 3], [3, -3], [6, 6], [6, -6]], float)
    sign = np.where(np.arange(n_per) % 2, 1.0, -1.0)[:, None]
    xl = np.concatenate([sigma * rng.normal(size=(n_per, d)) for _ in centres])
    xl[:, :2] += np.concatenate([sign * m for m in centres])
    yl = np.repeat(np.arange(len(centres)), n_per)
    keep = yl < 2
    xu = xl[keep] + 0.3 + sigma * rng.normal(size=(int(keep.sum()), d))
    return xl.astype(np.float32), yl, xu.astype(np.float32), yl[keep]


def _logits(path, x):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        model = torch.jit.load(str(path))
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize('k', [2, 3])
@pytest.mark.parametrize('norm', ['zscore', 'l2_standard', 'none'])
def test_linear_model_ts_reproduces_sklearn(tmp_path, k, norm):
    """The exported linear model (standardisation + one nn.Linear) gives scikit-learn's
    predict_proba on the standardised features, through the classifier node's loader, on raw
    features (scale 1e3, offset); two classes too (sklearn's binary model)."""
    xl, yl, xu, _ = gaussian_domains(2, k=2 * k)
    xl, yl = xl[yl < k] * 1e3 + 5e3, yl[yl < k]
    xu = xu * 1e3 + 5e3
    cfg = AdaptConfig.from_mapping(dict(SYN, input_norm=norm))
    tr = AdaptTrainer(cfg, FeatureSet(xl, yl), FeatureSet(xu))
    lin = LinearSource(tr)
    export_torchscript(lin, str(tmp_path / 'model.ts'))
    clf = load_classifier(tmp_path / 'model.ts')
    assert (clf.dim, clf.num_classes) == (32, k)
    with torch.no_grad():
        z = tr.model.norm(torch.from_numpy(xu)).double().numpy()
    want = lin.sklearn.predict_proba(z)
    np.testing.assert_allclose(clf.probabilities(xu), want, atol=2e-5)
    assert lin.sklearn.n_iter_[0] < 1000  # converged
    assert lin.sklearn.C == 1.0 and lin.sklearn.solver == 'lbfgs'


def _decision(deployed, step=150):
    passed = deployed == 'adapted'
    return SafeguardDecision(
        deployed,
        'label-free reason',
        ModelCheck(0.92, 0.0, 0.1, 0.95),
        ModelCheck(0.9, 0.0, 0.2, 1.0),
        [0, 1],
        20,
        step if passed else None,
        adapted_step=step if passed else None,
    )


def _evidence(vs_mlp, vs_adapted):
    """Held-out sign tests as linear_candidate gives them: [linear only, other only, p]."""
    from pwan_ros.adaptation.safeguard import sign_test

    def test(wins, losses):
        right = np.array([True] * wins + [False] * losses, dtype=bool)
        return list(sign_test(right, ~right)[:3])

    return {'val_accuracy': 0.95, 'mlp': test(*vs_mlp), 'adapted': test(*vs_adapted)}


def test_linear_rule():
    """The source-only model is the linear one when the held-out rows show it better than the
    network (exact sign test at alpha: 5 rows to 0 at 0.05); it replaces a passing adapted model
    only when they also show it better than that one; check rows that show the adapted candidate
    better deploy it (the kept snapshot)."""
    assert _evidence((5, 0), (0, 0))['mlp'] == [5, 0, 1 / 32]
    weak = consider_linear(_decision('adapted'), _evidence((4, 0), (9, 0)), 0.05)
    assert (weak.deployed, weak.source_only_model, weak.reason) == (
        'adapted',
        'mlp',
        'label-free reason',
    )
    assert weak.linear_val_accuracy == 0.95 and weak.linear_tests['mlp'] == [4, 0, 1 / 16]
    chosen = consider_linear(_decision('adapted'), _evidence((5, 0), (4, 0)), 0.05)
    assert (chosen.deployed, chosen.source_only_model, chosen.snapshot_step) == (
        'adapted',
        'linear',
        150,
    )
    assert chosen.reason.startswith('label-free reason; linear source-only model shown better')
    close = consider_linear(_decision('adapted'), _evidence((6, 1), (5, 0)), 0.05)
    assert (close.deployed, close.source_only_model) == ('adapted', 'mlp')  # 6:1 is p 0.0625
    beats = consider_linear(_decision('adapted'), _evidence((8, 1), (5, 0)), 0.05)
    assert (beats.deployed, beats.source_only_model, beats.snapshot_step) == (
        'source_only',
        'linear',
        None,
    )
    assert beats.adapted_step == 150 and beats.label == 'source_only (linear)'
    assert (
        'than the MLP (8:1, p 0.0195) and than the adapted model (5:0, p 0.0312)' in beats.reason
    )
    failed = consider_linear(_decision('source_only'), _evidence((5, 0), (0, 9)), 0.05)
    assert (failed.deployed, failed.source_only_model) == ('source_only', 'linear')
    assert failed.label == 'source_only (linear)'
    assert consider_linear(_decision('adapted'), None, 0.05) == _decision('adapted')
    shown = CheckVerdict(40, 0.9, 0.8, 5, 0, 1 / 32, 1.0, 0.05, 'adapted')
    back = apply_check(beats, shown, adapted=None)  # the kept snapshot: nothing to re-keep
    assert (back.deployed, back.snapshot_step) == ('adapted', 150)
    undecided = CheckVerdict(40, 0.9, 0.9, 1, 1, 0.75, 0.75, 0.05, 'undecided')
    assert apply_check(beats, undecided, adapted=None).deployed == 'source_only'


def test_linear_candidate_deployed_when_held_out_rows_favour_it(tmp_path, capsys):
    """Networks that cannot learn, classes a linear model separates: the held-out rows favour
    the linear model, which is deployed (fitted on all labelled rows); model.ts is
    candidates/source_only_linear.ts; summary, CLI line and in-memory form say so."""
    torch.set_num_threads(1)
    xl, yl, xu, yu = gaussian_domains(0)
    cfg = AdaptConfig.from_mapping(FROZEN)
    out = tmp_path / 'o'
    res = run_adaptation(cfg, FeatureSet(xl, yl), FeatureSet(xu, yu), out)
    sg = res.safeguard
    assert sg['source_only']['val_accuracy'] < 0.6  # the frozen network (deterministic)
    assert sg['linear_val_accuracy'] > sg['source_only']['val_accuracy'] + 0.3
    wins, losses, p = sg['linear_tests']['mlp']
    assert wins >= 10 * max(losses, 1) and p < 1e-3, sg['linear_tests']
    assert (res.deployed, res.source_only_model) == ('source_only', 'linear')
    assert (sg['deployed'], sg['source_only_model']) == ('source_only', 'linear')
    assert sg['snapshot_step'] is None and 'linear source-only model' in res.deployed_reason
    assert res.accuracy == res.source_only_accuracy > res.adapted_accuracy + 0.3
    logits = _logits(out / 'model.ts', xu)
    np.testing.assert_array_equal(logits, _logits(out / 'candidates/source_only_linear.ts', xu))
    np.testing.assert_array_equal(logits.argmax(1), np.load(res.predictions_path))
    for name in ('adapted.ts', 'source_only.ts'):
        assert (out / 'candidates' / name).stat().st_size > 0
    lin = LinearSource(AdaptTrainer(cfg, FeatureSet(xl, yl), FeatureSet(xu, yu)))  # all rows
    np.testing.assert_allclose(logits, lin.model(torch.from_numpy(xu)).detach().numpy())
    summary = json.loads(pathlib.Path(res.summary_path).read_text())
    assert summary['source_only_model'] == 'linear' and summary['safeguard'] == sg
    deployed, _, _, decision = adapt_with_safeguard(cfg, FeatureSet(xl, yl), FeatureSet(xu, yu))
    assert decision.to_dict() == sg and deployed.evaluate().accuracy == res.accuracy
    np.savez(tmp_path / 'l.npz', features=xl, labels=yl)
    np.savez(tmp_path / 'u.npz', features=xu)
    flags = [f'--{k.replace("_", "-")}={v}' for k, v in FROZEN.items()]
    argv = ['--labelled', str(tmp_path / 'l.npz'), '--unlabelled', str(tmp_path / 'u.npz')]
    assert adapt_main(argv + ['--output', str(tmp_path / 'cli'), '--quiet', *flags]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith('done: 60/60 steps deployed=source_only (linear) -> '), last


def test_network_kept_when_held_out_rows_favour_it(tmp_path):
    """Classes no linear model separates (XOR): the held-out rows favour the network; the linear
    candidate is written but never deployed. On linearly separable classes both are right on
    every held-out row (a tie keeps the network) and the adapted model is deployed."""
    torch.set_num_threads(1)
    xl, yl, xu, yu = xor_domains()
    cfg = AdaptConfig.from_mapping(dict(SYN, lr=1e-2))
    out = tmp_path / 'xor'
    res = run_adaptation(cfg, FeatureSet(xl, yl), FeatureSet(xu, yu), out)
    sg = res.safeguard
    assert sg['linear_val_accuracy'] < 0.5 < 0.9 < sg['source_only']['val_accuracy']
    assert sg['linear_tests']['mlp'][1] > sg['linear_tests']['mlp'][0]  # the network is better
    assert res.source_only_model == sg['source_only_model'] == 'mlp'
    name = 'adapted.ts' if res.deployed == 'adapted' else 'source_only.ts'
    np.testing.assert_array_equal(
        _logits(out / 'model.ts', xu), _logits(out / 'candidates' / name, xu)
    )
    assert (out / 'candidates' / 'source_only_linear.ts').stat().st_size > 0
    xl, yl, xu, yu = gaussian_domains(0)
    res = run_adaptation(
        AdaptConfig.from_mapping(SYN), FeatureSet(xl, yl), FeatureSet(xu, yu), tmp_path / 'g'
    )
    sg = res.safeguard
    assert sg['linear_val_accuracy'] == sg['source_only']['val_accuracy']
    assert (res.deployed, res.source_only_model) == ('adapted', 'mlp')
    assert sg['adapted_step'] == sg['snapshot_step'] == res.best_step


def test_resume_with_the_linear_candidate(tmp_path):
    """An interrupted run resumed decides and writes exactly what an uninterrupted one does (the
    linear candidate is refitted, deterministically, from the data the checkpoint names)."""
    torch.set_num_threads(1)
    xl, yl, xu, yu = gaussian_domains(0)
    cfg = AdaptConfig.from_mapping(FROZEN)
    sets = (FeatureSet(xl, yl), FeatureSet(xu, yu))
    whole = run_adaptation(cfg, *sets, tmp_path / 'a')
    calls = []
    part = run_adaptation(
        cfg, *sets, tmp_path / 'b', should_stop=lambda: calls.append(1) or len(calls) > 30
    )
    assert not part.completed and part.source_only_model is None and part.deployed is None
    res = run_adaptation(cfg, *sets, tmp_path / 'b', resume=True)
    assert res.completed and res.source_only_model == whole.source_only_model == 'linear'
    assert res.safeguard == whole.safeguard and res.accuracy == whole.accuracy
    for name in ('model.ts', 'candidates/source_only_linear.ts', 'candidates/adapted.ts'):
        np.testing.assert_array_equal(
            _logits(tmp_path / 'a' / name, xu), _logits(tmp_path / 'b' / name, xu)
        )


def test_check_rows_compare_the_adapted_candidate_with_the_linear_model(tmp_path):
    """With the linear model chosen, check rows compare the adapted candidate with it: labelled as
    the adapted candidate predicts them, they deploy it; with their true labels, the linear
    model."""
    torch.set_num_threads(1)
    xl, yl, xu, yu = gaussian_domains(0)
    cfg = AdaptConfig.from_mapping(FROZEN)
    sets = (FeatureSet(xl, yl), FeatureSet(xu, yu))
    first = run_adaptation(cfg, *sets, tmp_path / 'a')
    assert first.source_only_model == 'linear'
    adapted_pred = _logits(tmp_path / 'a' / 'candidates/adapted.ts', xu).argmax(1)
    res = run_adaptation(cfg, *sets, tmp_path / 'b', check=FeatureSet(xu, adapted_pred))
    assert res.deployed == 'adapted' and res.safeguard['check']['verdict'] == 'adapted'
    assert res.safeguard['check']['source_only_accuracy'] < 0.5
    np.testing.assert_array_equal(
        _logits(tmp_path / 'b' / 'model.ts', xu),
        _logits(tmp_path / 'b' / 'candidates/adapted.ts', xu),
    )
    assert res.safeguard['snapshot_step'] is not None
    res = run_adaptation(cfg, *sets, tmp_path / 'c', check=FeatureSet(xu[::3], yu[::3]))
    assert (res.deployed, res.source_only_model) == ('source_only', 'linear')
    assert res.safeguard['check']['verdict'] == 'source_only'
    np.testing.assert_array_equal(
        _logits(tmp_path / 'c' / 'model.ts', xu),
        _logits(tmp_path / 'c' / 'candidates/source_only_linear.ts', xu),
    )


def test_bench_table_reports_the_deployed_source_only_model(capsys):
    """bench_pda's table: deployed minus the better source-only column (seed means) and the
    safeguard's choice per seed (A adapted, M the network, L the linear model)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'bench'))
    import bench_pda

    def row(method, seed, acc, **kw):
        return dict(
            task='A>W', seed=seed, method=method, accuracy=acc, absent=0.0, seconds=1, **kw
        )

    rows = [
        row('logreg', 0, 0.80),
        *(row('mlp', s, a) for s, a in ((0, 0.70), (1, 0.74))),
        row('deployed', 0, 0.80, decision='source_only', source_model='linear'),
        row('deployed', 1, 0.75, decision='adapted', snapshot=500),
    ]
    bench_pda.print_table(rows, ['logreg', 'mlp', 'deployed'])
    line = [ln for ln in capsys.readouterr().out.splitlines() if '| A>W |' in ln][0]
    cells = [c.strip() for c in line.strip('|').split('|')]
    assert cells[-3:] == ['+5.5 (+1.0..+10.0)', '-2.5', 'L A@500']
