"""The safeguard: adapt only when the adapted model is predicted to be better than source-only.

A source-only model (same bottleneck architecture, ``method=source_only``, same seed and steps)
is trained alongside the adapted one, both on the labelled rows minus a stratified held-out
split. Without any unlabelled label, the two are compared on:

* ``val_accuracy``: accuracy on the held-out labelled rows, each class weighted by the
  source-only model's estimate of its share of the unlabelled domain (so classes that are absent
  there, which PWAN is meant to down-weight, do not count);
* ``outlier_mass``: the fraction of unlabelled rows predicted in classes that the source-only
  model estimates absent (predicted for less than ``1 / (2K)`` of the rows);
* ``agreement``: the fraction of unlabelled rows on which both models predict the same class;
* ``mean_entropy``: the mean prediction entropy on the unlabelled rows.

The adapted model is deployed only when its weighted held-out accuracy is not below source-only
by more than ``safeguard_margin``, its outlier mass does not exceed source-only's by more than
``safeguard_margin``, it agrees with source-only on at least ``min_agreement`` of the unlabelled
rows and it is more confident (lower mean entropy). Otherwise the source-only model is refitted
on all labelled rows (the held-out split served the decision) and deployed, and the decision says
which test failed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from .data import FeatureSet


def holdout_split(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Stratified held-out labelled rows (sorted indices): ``round(fraction * n_c)`` of each
    class c, at least one when the class has two or more rows, never all of its rows."""
    rng = np.random.default_rng([seed, 0x5AFE])
    out: List[np.ndarray] = []
    for c in range(int(labels.max()) + 1):
        idx = np.flatnonzero(labels == c)
        if idx.size < 2 or fraction <= 0:
            continue
        take = int(min(idx.size - 1, max(1, round(fraction * idx.size))))
        out.append(rng.choice(idx, take, replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)


@torch.no_grad()
def _predict(trainer, fs: FeatureSet, index: Optional[np.ndarray] = None):
    """(predictions (n,), probabilities (n, K)) of a trainer's model on rows of ``fs``."""
    model, dev, chunk = trainer.model, trainer.device, trainer.config.eval_batch
    model.eval()
    if index is None:
        blocks = fs.batches(chunk)
    else:
        blocks = (fs.rows(index[s : s + chunk]) for s in range(0, index.size, chunk))
    probs = [
        model(torch.from_numpy(b).to(dev)).softmax(dim=1).double().cpu().numpy() for b in blocks
    ]
    p = np.concatenate(probs) if probs else np.zeros((0, trainer.num_classes))
    return p.argmax(axis=1), p


@dataclass
class ModelCheck:
    """One candidate model judged without unlabelled labels."""

    val_accuracy: Optional[float]
    outlier_mass: float
    mean_entropy: float
    agreement: float


@dataclass
class SafeguardDecision:
    """Which model was deployed (``adapted`` | ``source_only``) and why."""

    deployed: str
    reason: str
    adapted: ModelCheck
    source_only: ModelCheck
    present_classes: List[int]
    n_holdout: int

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)


def _weighted_accuracy(pred, labels, weights) -> Optional[float]:
    if labels.size == 0:
        return None
    acc = np.array(
        [
            (pred[labels == c] == c).mean() if (labels == c).any() else np.nan
            for c in range(weights.size)
        ]
    )
    ok = np.isfinite(acc) & (weights > 0)
    return float((acc[ok] * weights[ok]).sum() / weights[ok].sum()) if ok.any() else None


def decide(
    adapted, source, holdout: np.ndarray, margin: float, min_agreement: float
) -> SafeguardDecision:
    """Compare two trained :class:`~pwan_ros.adaptation.trainer.AdaptTrainer` on the unlabelled
    rows and the held-out labelled rows ``holdout``; see the module docstring for the rule."""
    k = adapted.num_classes
    pa, proba = _predict(adapted, adapted.unlabelled)
    ps, probs = _predict(source, source.unlabelled)
    share = np.bincount(ps, minlength=k) / max(1, ps.size)
    present = share >= 1.0 / (2 * k)
    weights = probs.mean(axis=0)  # source-only estimate of the class shares
    labels = adapted.labelled.labels[holdout]
    va, _ = _predict(adapted, adapted.labelled, holdout)
    vs, _ = _predict(source, source.labelled, holdout)

    def entropy(p):
        return float(-(p * np.log(np.clip(p, 1e-30, None))).sum(axis=1).mean())

    agree = float((pa == ps).mean())
    a = ModelCheck(
        _weighted_accuracy(va, labels, weights),
        float((~present[pa]).mean()),
        entropy(proba),
        agree,
    )
    s = ModelCheck(
        _weighted_accuracy(vs, labels, weights), float((~present[ps]).mean()), entropy(probs), 1.0
    )
    fails = []
    if (
        a.val_accuracy is not None
        and s.val_accuracy is not None
        and a.val_accuracy < s.val_accuracy - margin
    ):
        fails.append(
            f'held-out labelled accuracy {a.val_accuracy:.3f} < source-only {s.val_accuracy:.3f} '
            f'- {margin:g}'
        )
    if a.outlier_mass > s.outlier_mass + margin:
        fails.append(
            f'{a.outlier_mass:.1%} of unlabelled rows in estimated-absent classes '
            f'(source-only {s.outlier_mass:.1%})'
        )
    if agree < min_agreement:
        fails.append(
            f'agrees with source-only on only {agree:.1%} of unlabelled rows (< '
            f'{min_agreement:.0%})'
        )
    if a.mean_entropy >= s.mean_entropy:
        fails.append(
            f'not more confident than source-only (entropy {a.mean_entropy:.3f} >= '
            f'{s.mean_entropy:.3f})'
        )
    if fails:
        return SafeguardDecision(
            'source_only',
            'adapted model not predicted to be better: ' + '; '.join(fails),
            a,
            s,
            np.flatnonzero(present).tolist(),
            int(holdout.size),
        )
    reason = (
        'adapted model kept: held-out accuracy '
        f'{a.val_accuracy if a.val_accuracy is not None else float("nan"):.3f} (source-only '
        f'{s.val_accuracy if s.val_accuracy is not None else float("nan"):.3f}), outlier mass '
        f'{a.outlier_mass:.1%} (source-only {s.outlier_mass:.1%}), agreement {agree:.1%}'
    )
    return SafeguardDecision(
        'adapted', reason, a, s, np.flatnonzero(present).tolist(), int(holdout.size)
    )


def train_source_only(
    config, labelled: FeatureSet, unlabelled: FeatureSet, holdout: Optional[np.ndarray]
):
    """The source-only companion: the same config with ``method=source_only``, trained to the end
    without the ``holdout`` rows (None: on all labelled rows). Deterministic (same seed, same
    rows), so a resumed run recomputes the same model."""
    from .trainer import AdaptTrainer

    tr = AdaptTrainer(
        dataclasses.replace(config, method='source_only'), labelled, unlabelled, holdout
    )
    tr.train()
    return tr


def adapt_with_safeguard(config, labelled: FeatureSet, unlabelled: FeatureSet):
    """Train the adapted model and its source-only companion (in memory, no files) and decide.

    Returns ``(deployed, adapted, source_only, decision)``: trainers and the
    :class:`SafeguardDecision`; ``deployed`` is ``adapted`` or ``source_only``, which is then the
    source-only model refitted on all labelled rows (the held-out rows are for the decision). What
    :func:`pwan_ros.adaptation.runner.run_adaptation` does, without checkpoints or outputs."""
    from .trainer import AdaptTrainer

    holdout = holdout_split(labelled.labels, config.holdout_fraction, config.seed)
    adapted = AdaptTrainer(config, labelled, unlabelled, holdout)
    adapted.train()
    source = train_source_only(config, labelled, unlabelled, holdout)
    decision = decide(adapted, source, holdout, config.safeguard_margin, config.min_agreement)
    if decision.deployed == 'adapted':
        return adapted, adapted, source, decision
    refit = train_source_only(config, labelled, unlabelled, None)
    return refit, adapted, refit, decision
