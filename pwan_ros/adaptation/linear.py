"""The safeguard's linear source-only candidate: multinomial logistic regression (scikit-learn,
L-BFGS, C = 1) on the labelled rows, standardised by the trainer's fitted ``input_norm``.

:class:`LinearSource` reads like a trainer where the safeguard and the runner use one (``model``,
``device``, ``config``, ``labelled``, ``unlabelled``, ``num_classes``, :meth:`evaluate`); its
``model`` is a :class:`LinearClassifier` (the same :class:`InputNorm` + one ``nn.Linear``), which
:func:`pwan_ros.adaptation.runner.export_torchscript` writes as features (n, D) -> logits (n, K).
scikit-learn is imported when a model is fitted, not with the package.
"""

from __future__ import annotations

import copy
import warnings
from typing import Optional

import numpy as np
import torch
from torch import nn

from .models import InputNorm

#: L-BFGS stops at this projected-gradient norm (of sklearn's mean-loss objective): the default
#: 1e-4 stopped 1-2 % of SURF predictions away from the optimum; 1e-6 reaches it (< 100 steps)
TOL = 1e-6
MAX_ITER = 1000


class LinearClassifier(nn.Module):
    """Logistic regression on standardised features: (n, D) float32 -> logits (n, K)."""

    def __init__(self, norm: InputNorm, weight: np.ndarray, bias: np.ndarray):
        super().__init__()
        self.norm = norm
        self.head = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.head.weight.copy_(torch.from_numpy(weight))
            self.head.bias.copy_(torch.from_numpy(bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


def fit_logistic(x: np.ndarray, labels: np.ndarray, k: int, threads: int = 0):
    """``(sklearn model, weight (K, D), bias (K,))`` of logistic regression on rows ``x`` (n, D)
    with ``labels`` in 0..k-1 (all present), on at most ``threads`` BLAS threads (0: the
    default). Two classes: sklearn's binary model, as logits ``(0, w x + b)``, which give its
    predict_proba under a softmax."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    clf = LogisticRegression(C=1.0, solver='lbfgs', tol=TOL, max_iter=MAX_ITER)
    with warnings.catch_warnings(), threadpool_limits(threads if threads > 0 else None):
        warnings.simplefilter('ignore', ConvergenceWarning)
        clf.fit(np.asarray(x, dtype=np.float64), labels)
    if not np.array_equal(clf.classes_, np.arange(k)):
        raise ValueError(f'logistic regression needs rows of all {k} classes')
    coef, icpt = clf.coef_, clf.intercept_
    if k == 2:
        coef, icpt = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], icpt])
    return clf, coef.astype(np.float32), icpt.astype(np.float32)


class LinearSource:
    """Logistic regression fitted on ``rows`` of ``trainer``'s labelled set (None: all of them),
    on the features as ``trainer.model.norm`` standardises them (fitted on all labelled rows, as
    for the network), on ``config.threads`` BLAS threads. Deterministic: resume needs no state of
    it. On the CPU."""

    def __init__(self, trainer, rows: Optional[np.ndarray] = None):
        self.labelled, self.unlabelled = trainer.labelled, trainer.unlabelled
        self.config, self.num_classes = trainer.config, trainer.num_classes
        self.device = torch.device('cpu')
        norm = copy.deepcopy(trainer.model.norm).to(self.device).eval()
        rows = np.arange(self.labelled.n) if rows is None else np.asarray(rows, np.int64)
        with torch.no_grad():
            x = norm(torch.from_numpy(self.labelled.rows(rows))).double().numpy()
        self.sklearn, weight, bias = fit_logistic(
            x, self.labelled.labels[rows], self.num_classes, self.config.threads
        )
        self.model = LinearClassifier(norm, weight, bias).eval()

    def evaluate(self):
        """:class:`~pwan_ros.adaptation.trainer.UnlabelledPass` of the unlabelled rows (as
        :meth:`AdaptTrainer.evaluate <pwan_ros.adaptation.trainer.AdaptTrainer.evaluate>`)."""
        from .trainer import unlabelled_pass

        return unlabelled_pass(
            self.model, self.unlabelled, self.device, self.config.eval_batch, self.num_classes
        )
