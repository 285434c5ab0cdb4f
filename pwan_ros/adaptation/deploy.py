"""Deploy an adapted classifier: load the TorchScript ``model.ts`` of a run and classify features.

``model.ts`` (:func:`pwan_ros.adaptation.runner.export_torchscript`) maps float32 features
(n, D) to logits (n, K) and holds its input normalisation. Class names come from the run's
``summary.json`` beside the model when it records them. ROS-free: the ``pwan_classifier`` node
(:mod:`pwan_ros.ros.classifier_node`) only converts messages around :meth:`Classifier.classify`.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from pwan_ros.params import check, param

from .errors import AdaptConfigError, AdaptInputError
from .trainer import resolve_device

RELIABILITIES = ('reliable', 'best_effort')


@dataclass(frozen=True)
class ClassifierConfig:
    """Parameters of the ``pwan_classifier`` node (ROS parameter names)."""

    model: str = param(
        '',
        'TorchScript classifier written by pwan_adapt / pwan_adapt_node (model.ts in its '
        "output directory); required",
    )
    device: str = param('auto', 'inference device; auto = CUDA when available', fmt='device')
    reliability: str = param(
        'reliable',
        'QoS reliability of the features subscription: reliable (rclpy '
        'publishers, ros2 bag play) or best_effort (sensor-data publishers)',
        choices=RELIABILITIES,
    )
    queue_depth: int = param(
        5000,
        'queue depth (history) of the features subscription and of the output '
        'publishers; a burst larger than this that arrives faster than it is '
        'classified loses messages (they are counted and reported)',
        1,
        1000000,
    )
    status_period: float = param(
        1.0,
        'seconds between pwan_classifier status messages on /diagnostics '
        '(received, classified, skipped, dropped counts)',
        0.05,
        3600.0,
    )

    def __post_init__(self):
        check(self, AdaptConfigError, flags=False)


@dataclass(frozen=True)
class Prediction:
    """One classified feature vector: 0-based ``class_id``, its softmax probability ``confidence``
    and its ``class_name`` (None when the run recorded no names)."""

    class_id: int
    confidence: float
    class_name: Optional[str] = None


class Classifier:
    """A loaded classifier: features (n, dim) float32 -> logits (n, num_classes). Use
    :func:`load_classifier`."""

    def __init__(
        self,
        module,
        path: str,
        dim: int,
        num_classes: int,
        device: torch.device,
        class_names: Optional[List[str]] = None,
    ):
        self.module, self.path, self.dim, self.num_classes = module, path, dim, num_classes
        self.device, self.class_names = device, class_names

    def probabilities(self, features) -> np.ndarray:
        """Softmax probabilities (n, num_classes) float32 of features (n, dim) or (dim,) -> (1, K).
        Raises AdaptInputError for a wrong shape, non-finite values or values the model
        overflows on."""
        x = np.asarray(features, dtype=np.float32)
        x = x.reshape(1, -1) if x.ndim == 1 else x
        if x.ndim != 2 or x.shape[1] != self.dim:
            got = f'length {x.shape[-1]}' if x.ndim == 2 else f'shape {x.shape}'
            raise AdaptInputError(f'feature vector has {got}; the model expects {self.dim} values')
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        if bad.size:
            raise AdaptInputError(f'features contain NaN or infinite values (row {int(bad[0])})')
        with torch.inference_mode():
            logits = self.module(torch.from_numpy(x).to(self.device))
            probs = torch.softmax(logits.float(), dim=1).cpu().numpy()
        bad = np.flatnonzero(~np.isfinite(probs).all(axis=1))
        if bad.size:  # finite but huge inputs (1e38) overflow inside the model: no class
            raise AdaptInputError(
                f'features overflow the model (row {int(bad[0])}, largest magnitude '
                f'{float(np.abs(x[bad[0]]).max()):g}): no class can be given'
            )
        return probs

    def classify(self, features) -> Union[Prediction, List[Prediction]]:
        """Predictions of features (n, dim) -> list of n; of one vector (dim,) -> one
        Prediction."""
        probs = self.probabilities(features)
        ids = probs.argmax(axis=1)
        preds = [
            Prediction(
                int(c), float(probs[i, c]), self.class_names[c] if self.class_names else None
            )
            for i, c in enumerate(ids)
        ]
        return preds[0] if np.ndim(features) == 1 else preds


def _class_names(model_path: str, k: int) -> Optional[List[str]]:
    """``class_names`` of the run's summary.json beside the model when it lists K of them."""
    try:
        with open(
            os.path.join(os.path.dirname(os.path.abspath(model_path)), 'summary.json'),
            encoding='utf-8',
        ) as fh:
            names = json.load(fh).get('class_names')
    except (OSError, ValueError, AttributeError):
        return None
    return [str(n) for n in names] if isinstance(names, list) and len(names) == k else None


def load_classifier(
    path, device: str = 'cpu', class_names: Optional[Sequence[str]] = None
) -> Classifier:
    """Load ``model.ts`` on ``device`` (auto | cpu | cuda | cuda:N) and check it: the input
    dimension D is the first weight matrix's width, a probe (1, D) must give logits (1, K).
    ``class_names`` (K,): default from the run's summary.json. Errors are one-line
    AdaptInputError (missing, corrupt or not a classifier) or AdaptConfigError (device)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise AdaptInputError(f'model {path} does not exist')
    if os.path.isdir(path):
        raise AdaptInputError(f'model {path} is a directory (expected the model.ts file in it)')
    dev = resolve_device(device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            module = torch.jit.load(path, map_location=dev)
    except (RuntimeError, ValueError, OSError) as exc:
        raise AdaptInputError(
            f'model {path} is not a TorchScript model ({str(exc).split(". ")[0][:100]}); '
            'pwan_adapt writes one as model.ts, checkpoints/*.pt are training state'
        ) from None
    module.eval()
    weights = [p for p in module.parameters() if p.dim() == 2]
    try:
        dim = int(weights[0].shape[1])
        with torch.inference_mode():
            out = module(torch.ones(1, dim, device=dev))
        ok = (
            isinstance(out, torch.Tensor)
            and out.dim() == 2
            and out.shape[0] == 1
            and out.shape[1] >= 1
        )
    except Exception:  # no weight matrix, or a forward that does not take (n, D) features
        ok = False
    if not ok:
        raise AdaptInputError(
            f'model {path} is not a classifier of feature vectors (n, D) -> logits (n, K)'
        )
    k = int(out.shape[1])
    names = list(class_names) if class_names is not None else _class_names(path, k)
    if names is not None and len(names) != k:
        raise AdaptInputError(f'{len(names)} class names for a model with {k} classes')
    return Classifier(module, path, dim, k, dev, names)
