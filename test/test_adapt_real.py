"""Slow tests on real data (../shared/data/pda, Office-Caltech10 GoogLeNet features) and on a large
memory-mapped unlabelled set. They fail (never skip) when the data is missing."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.io as sio
import torch

from pwan_ros.adaptation import AdaptConfig, AdaptTrainer, FeatureSet, load_npz, save_npz

ROOT = pathlib.Path(__file__).resolve().parents[1]
PDA = ROOT.parent / 'shared' / 'data' / 'pda' / 'office_caltech10_googlenet'
CLI = pathlib.Path(sys.executable).parent / 'pwan_adapt'
sys.path.insert(0, str(ROOT / 'bench'))
from bench_pda import CLASSES  # noqa: E402  (Office-Caltech10's class names, in label order)

NAMES = list(CLASSES)


def domain(name):
    path = PDA / f'{name}.mat'
    assert path.is_file(), f'real data missing: {path} (see ../shared/data/README.md)'
    m = sio.loadmat(path)
    return m['fts'].astype(np.float32), m['labels'].ravel().astype(np.int64) - 1


@pytest.mark.slow
def test_real_webcam_to_amazon_pwan_beats_source_only(tmp_path):
    """W->A, unlabelled amazon keeps classes 0-4: PWAN (defaults) beats source-only, predicts
    fewer absent classes, and complete alignment collapses onto absent classes."""
    torch.set_num_threads(1)
    xs, ls = domain('webcam')
    xt, lt = domain('amazon')
    keep = lt < 5
    lab, unl = FeatureSet(xs, ls), FeatureSet(xt[keep], lt[keep])
    res = {}
    for method in ('source_only', 'pwan'):
        tr = AdaptTrainer(AdaptConfig(method=method, device='cpu', seed=0), lab, unl)
        tr.train()
        res[method] = tr.evaluate()
    assert res['pwan'].accuracy >= res['source_only'].accuracy + 0.01, res
    assert res['pwan'].absent_fraction < res['source_only'].absent_fraction


@pytest.mark.slow
def test_real_cli_end_to_end(tmp_path):
    """A->D through the console script with the shipped config file and class names."""
    xs, ls = domain('amazon')
    xt, lt = domain('dslr')
    keep = lt < 5
    save_npz(tmp_path / 'amazon.npz', xs, ls, NAMES)
    save_npz(tmp_path / 'dslr.npz', xt[keep], lt[keep])
    proc = subprocess.run(
        [
            str(CLI),
            '--labelled',
            str(tmp_path / 'amazon.npz'),
            '--unlabelled',
            str(tmp_path / 'dslr.npz'),
            '--config',
            str(ROOT / 'config' / 'adapt.yaml'),
            '--output',
            str(tmp_path / 'out'),
            '--device',
            'cpu',
            '--threads',
            '1',
            '--json',
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s['completed'] and s['class_names'] == NAMES and s['steps_done'] == AdaptConfig().steps
    assert s['accuracy'] > 0.85 and s['absent_class_fraction'] < 0.05
    assert set(s['estimated_present_classes']) <= set(range(10))
    pred = np.load(s['predictions_path'])
    assert pred.shape == (int(keep.sum()),)
    assert (tmp_path / 'out' / 'plots' / 'projection.png').stat().st_size > 0


@pytest.mark.slow
def test_large_unlabelled_set_is_streamed(tmp_path):
    """1.5M x 64 unlabelled rows (384 MB, uncompressed npz) with a 64 MB limit: memory-mapped,
    trained on and predicted in blocks."""
    rng = np.random.default_rng(0)
    k, d, n = 4, 64, 1_500_000
    means = rng.normal(size=(k, d)) * 2
    xl = np.concatenate([means[c] + rng.normal(size=(200, d)) for c in range(k)]).astype(
        np.float32
    )
    save_npz(tmp_path / 'lab.npz', xl, np.repeat(np.arange(k), 200))
    big = np.lib.format.open_memmap(
        tmp_path / 'features.npy', mode='w+', dtype=np.float32, shape=(n, d)
    )
    yl = np.empty(n, np.int64)
    for s in range(0, n, 250_000):
        lab = rng.integers(0, 2, 250_000)
        big[s : s + 250_000] = means[lab] + 0.5 + rng.normal(size=(250_000, d))
        yl[s : s + 250_000] = lab
    big.flush()
    del big
    import zipfile

    with zipfile.ZipFile(tmp_path / 'unl.npz', 'w', zipfile.ZIP_STORED) as zf:
        zf.write(tmp_path / 'features.npy', 'features.npy')
        with zf.open('labels.npy', 'w') as fh:
            np.save(fh, yl)
    (tmp_path / 'features.npy').unlink()
    fs = load_npz(tmp_path / 'unl.npz', 'unlabelled', max_memory_mb=64)
    assert isinstance(fs.features, np.memmap) and fs.n == n
    fs.close()
    proc = subprocess.run(
        [
            str(CLI),
            '--labelled',
            str(tmp_path / 'lab.npz'),
            '--unlabelled',
            str(tmp_path / 'unl.npz'),
            '--output',
            str(tmp_path / 'out'),
            '--steps',
            '60',
            '--warmup-steps',
            '30',
            '--eval-interval',
            '1000',
            '--memory-limit-mb',
            '64',
            '--eval-batch',
            '65536',
            '--device',
            'cpu',
            '--plots',
            'false',
            '--json',
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    pred = np.load(s['predictions_path'], mmap_mode='r')
    assert pred.shape == (n,) and s['n_unlabelled'] == n
    assert s['accuracy'] > 0.9


@pytest.mark.build
def test_colcon_install_has_adapt_node_launch_and_config(colcon_install):
    """What `ros2 launch pwan_ros adapt.launch.py` needs is installed by a colcon build."""
    prefix = colcon_install / 'pwan_ros'
    for exe in ('pwan_adapt_node', 'pwan_adapt', 'pwan_adapt_import'):
        assert (prefix / 'lib' / 'pwan_ros' / exe).is_file(), exe
    assert not (prefix / 'lib' / 'pwan_ros' / 'adapt_node').exists()  # a name of no release
    assert (prefix / 'share' / 'pwan_ros' / 'launch' / 'adapt.launch.py').is_file()
    assert (prefix / 'share' / 'pwan_ros' / 'config' / 'adapt.yaml').is_file()
