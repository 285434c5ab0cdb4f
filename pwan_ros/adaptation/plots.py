"""PNG plots of a finished run: losses, m_alpha, class weights, 2-D PCA of bottleneck features."""

from __future__ import annotations

import os

import numpy as np

from pwan_ros.io.atomic import atomic_path


def _save(fig, path):
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format='png', dpi=100, bbox_inches='tight')


def write_plots(trainer, directory: str, max_points: int = 2000) -> None:
    import matplotlib

    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    hist = trainer.state.history
    steps = np.array([h['step'] for h in hist])
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ('loss', 'ce', 'w1', 'entropy', 'gp'):
        ax.plot(steps, [h[key] for h in hist], label=key, lw=0.8)
    ax.set_xlabel('step')
    ax.set_title('training losses (batch means)')
    ax.legend()
    _save(fig, os.path.join(directory, 'losses.png'))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h['m_alpha'] for h in hist])
    ax.set_xlabel('step')
    ax.set_ylabel('m_alpha')
    ax.set_yscale('log')
    ax.set_title('labelled-domain mass m_alpha')
    _save(fig, os.path.join(directory, 'm_alpha.png'))
    plt.close(fig)

    k = trainer.num_classes
    names = trainer.labelled.class_names or [str(c) for c in range(k)]
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * k), 3.5))
    ax.bar(np.arange(k), trainer.state.mu)
    ax.axhline(1.0, color='grey', ls='--', lw=0.8)
    ax.set_xticks(np.arange(k))
    ax.set_xticklabels(names, rotation=60, ha='right', fontsize=7)
    ax.set_ylabel('mu (mean 1)')
    ax.set_title('class weights of the labelled cross-entropy')
    _save(fig, os.path.join(directory, 'class_weights.png'))
    plt.close(fig)

    rng = np.random.default_rng(0)
    ia = np.sort(
        rng.choice(trainer.labelled.n, min(max_points, trainer.labelled.n), replace=False)
    )
    ib = np.sort(
        rng.choice(trainer.unlabelled.n, min(max_points, trainer.unlabelled.n), replace=False)
    )
    za, zb = trainer.embed(trainer.labelled, ia), trainer.embed(trainer.unlabelled, ib)
    z = np.concatenate([za, zb]).astype(np.float64)
    z -= z.mean(0)
    _, _, vt = np.linalg.svd(z, full_matrices=False)
    p = z @ vt[:2].T
    fig, ax = plt.subplots(figsize=(6, 5))
    sc = ax.scatter(
        p[: len(ia), 0],
        p[: len(ia), 1],
        c=trainer.labelled.labels[ia],
        cmap='tab20',
        s=6,
        alpha=0.5,
        label='labelled (colour = class)',
    )
    ax.scatter(
        p[len(ia) :, 0], p[len(ia) :, 1], c='k', marker='x', s=8, lw=0.6, label='unlabelled'
    )
    ax.legend(fontsize=7)
    ax.set_title('bottleneck features, PCA 2-D')
    fig.colorbar(sc, ax=ax, label='class id')
    _save(fig, os.path.join(directory, 'projection.png'))
    plt.close(fig)
