"""Translations by votes: where a point set, turned by a given rotation, meets another most often.

PWAN's rotation starts (the tournament's, the global search's) are turned about the origin; the
translation that puts a turned start on the reference is not the difference of the centroids,
which both shift with the part that overlaps (and with outliers), but the translation most pairs
of points agree on. Frames: caller's (or the core's normalised) units; a pose maps source ->
reference, ``x = R y + t``.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

__all__ = ['VOTERS', 'VOTED_ON', 'voted_translation', 'start_translations']

#: source points that vote for the translation of each rotation
VOTERS = 128
#: reference points they vote against (a sample of larger references)
VOTED_ON = 4096


def voted_translation(
    source: np.ndarray, reference: np.ndarray, rotation: np.ndarray, cell: float
) -> tuple:
    """(translation (3,), votes): where ``source`` points (n, 3), turned by ``rotation`` (3, 3),
    meet ``reference`` points (m, 3) most often: every pair votes for ``q - R p``, the votes are
    binned in cubes of side ``cell``, and the mean vote of the fullest bin is returned with its
    count. Uniform outliers and the parts that do not overlap spread their votes thinly. (A plane's
    votes fill a plane of bins: in a room the fullest bin can be a slide along the floor, which the
    global search's refusal rules are for.) The cell is at least 1/4096 of the votes' span
    (duplicate points give a zero spacing). Cost: n m votes. Empty input: (zeros, 0)."""
    if len(source) == 0 or len(reference) == 0:
        return np.zeros(3), 0
    turned = source @ rotation.T
    lo = reference.min(0) - turned.max(0)  # the smallest vote per axis
    span = (reference.max(0) - reference.min(0)) + (turned.max(0) - turned.min(0))
    cell = max(float(cell) if np.isfinite(cell) else 0.0, float(span.max()) / 4096.0, 1e-12)
    dims = (span / cell).astype(np.int64) + 1
    # per axis, the (n, m) cell indices of q - R p in float32 (a few MB), combined into one key
    flat = np.zeros((len(turned), len(reference)), dtype=np.int64)
    for axis in range(3):
        idx = np.subtract.outer(
            (reference[:, axis] - lo[axis]).astype(np.float32), turned[:, axis].astype(np.float32)
        ).T
        idx *= np.float32(1.0 / cell)
        np.clip(idx, 0, dims[axis] - 1, out=idx)
        flat *= dims[axis]
        flat += idx.astype(np.int64)
    flat = flat.ravel()
    if int(np.prod(dims)) <= 16_000_000:
        best = int(np.argmax(np.bincount(flat)))
    else:  # a large scene at a fine cell: sparse bins
        uniq, counts = np.unique(flat, return_counts=True)
        best = int(uniq[np.argmax(counts)])
    i, j = np.divmod(np.flatnonzero(flat == best), len(reference))
    return (reference[j] - turned[i]).mean(0), int(len(i))


def start_translations(
    source: np.ndarray,
    reference: np.ndarray,
    rotations: Sequence[np.ndarray],
    cell: float,
    seed: int = 0,
) -> List[Tuple[np.ndarray, int]]:
    """[(translation (3,), votes)] per rotation (3, 3) of ``rotations``: :func:`voted_translation`
    of :data:`VOTERS` source points against at most :data:`VOTED_ON` reference points (m, 3)
    (seeded samples: the votes of one rotation fit in a few MB)."""
    rng = np.random.default_rng(seed)
    voters = source[rng.choice(len(source), min(VOTERS, len(source)), replace=False)]
    targets = (
        reference
        if len(reference) <= VOTED_ON
        else reference[rng.choice(len(reference), VOTED_ON, replace=False)]
    )
    return [voted_translation(voters, targets, rot, cell) for rot in rotations]
