"""The fit of a non-rigid registration with ``prealign``, coarse to fine: rigid PWAN
registration(s) first (with ``config.starts``; large rotations are out of reach of a deformation
started at identity), then the deformation from each distinct rigid finalist worth deforming;
the deformed results are compared by their overlap score (a rigid fit of a deformed shape can
rank a wrong, symmetric pose first)."""

from __future__ import annotations

import dataclasses
import numpy as np

from ..preprocess import median_spacing, random_subset
from ..problem import Request, fit_reference
from ..reference_cache import ReferenceCache
from ..result import RegistrationResult
from .fit import fit
from .scoring import distinct_poses, overlap_score

__all__ = ['PREALIGN_GAP', 'deform', 'deformable_finalists']

#: non-rigid prealign: a rigid finalist whose overlap score (fraction of the source off the
#: reference) is above the best finalist's by more than this is a distinct, worse pose and is not
#: deformed (a deformation recovers the few points a rigid fit of a deformed shape leaves off,
#: not this many)
PREALIGN_GAP = 0.1


def deform(request: Request) -> RegistrationResult:
    """The rigid pre-alignment(s) of ``request`` (a non-rigid one with ``prealign``), then the
    deformation from each distinct finalist worth deforming (:func:`deformable_finalists`, at
    most ``prealign_keep``); the best by the overlap score. Steps, u and tolerance left None take
    the rigid defaults in the rigid stage; the network and warm-up stay the non-rigid ones
    (``request.config`` is pinned)."""
    config, should_stop = request.config, request.should_stop
    # the rigid and non-rigid stages share the reference's search structures
    cache = request.cache if request.cache is not None else ReferenceCache()
    rigid = config.replace(transform='rigid', prealign=False, self_check=False)
    rigid_request = request.with_(config=rigid, potential_state=None, cache=cache)
    cands = fit(rigid_request)
    ref_clean = fit_reference(request.reference)  # validated by the rigid stage
    # distinct poses only: finalists that converged to the same pose (within the reference
    # sampling) would be deformed twice
    tol = median_spacing(random_subset(ref_clean, 5000, np.random.default_rng(config.seed)))
    placements = [c[1].transformed_source for c in cands]
    pres = [cands[i] for i in distinct_poses(placements, tol, config.prealign_keep)]
    pres = deformable_finalists(pres, ref_clean, config.seed)
    deforming = request.with_(config=config.replace(prealign=False), cache=cache)
    best = None
    for _, pre in pres:
        if best is not None and should_stop is not None and should_stop():
            break
        res = fit(deforming.with_(init=pre.transform))[0][1]
        score = (
            overlap_score(res.transformed_source, ref_clean, config.seed) if len(pres) > 1 else 0.0
        )
        res = dataclasses.replace(
            res,
            timings={**res.timings, 'prealign': pre.time_s},
            iterations=res.iterations + pre.iterations,
            potential_updates=res.potential_updates + pre.potential_updates,
            start_index=pre.start_index,
        )
        if best is None or score < best[0]:
            best = (score, res)
    return best[1]


def deformable_finalists(finalists: list, reference: np.ndarray, seed: int) -> list:
    """The rigid ``(index, RegistrationResult)`` finalists of a non-rigid prealign worth deforming:
    those whose overlap score (fraction of ``transformed_source`` off ``reference``, (m, d)) is
    within :data:`PREALIGN_GAP` of the best one's, in their order."""
    if len(finalists) < 2:
        return list(finalists)
    scores = [overlap_score(r.transformed_source, reference, seed) for _, r in finalists]
    return [f for f, sc in zip(finalists, scores) if sc <= min(scores) + PREALIGN_GAP]
