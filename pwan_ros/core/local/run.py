"""What a registration's fit works with while it runs (:class:`FitRun`): its problem, Alg. 1's
sampled sets, the fine-tune's data, how starts are scored, and what it spent."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy.spatial import cKDTree

from ..config import RegistrationConfig
from ..problem import Problem, SampledProblem
from ..reference_cache import PreparedReference
from ..finetune.objective import FineTuneData, partial_objective, select_pairs
from ..finetune.stage import finetune_stage
from .scoring import OverlapScorer

__all__ = ['FitRun']


@dataclass
class FitRun:
    """One registration's fit while it runs: the prepared problem (``prob``), the resolved
    ``config``, Alg. 1's :class:`SampledProblem`, the distance threshold in caller units
    (``h_caller``; None for the mass type), the fine-tune's data (``data``; ``small``: the
    multi-start's sample of it), the multi-start's ``scorer`` (None: the fixed-mass objective on
    the sampled sets), the reference's search structures (``prep``), whether the last final
    fine-tune stopped at its cap (``capped``), and what it spent (seconds per stage, steps,
    updates, fine-tune iterations)."""

    prob: Problem
    config: RegistrationConfig
    sampled: SampledProblem
    h_caller: Optional[float]
    data: Optional[FineTuneData]
    small: Optional[FineTuneData]
    scorer: Optional[OverlapScorer]
    prep: PreparedReference
    capped: bool = False
    timings: dict = field(default_factory=dict)
    steps: int = 0
    updates: int = 0
    finetune_iterations: int = 0

    def score(self, a: np.ndarray, t: np.ndarray) -> float:
        """A start's score at (a, t) (lower is better): the scorer's, else the fixed-mass partial
        nearest-neighbour objective of the sampled sets."""
        if self.scorer is not None:
            return self.scorer(a, t)
        s = self.sampled
        h = s.h if s.h else 0.0
        dist, _ = cKDTree(s.xs).query(s.ys @ a + t, k=1)
        count = self.matched_count()
        sel = select_pairs(dist, self.config.divergence, count, h)
        return partial_objective(dist, sel, self.config.divergence, h)

    def matched_count(self) -> int:
        """Sampled source points the mass type matches (0 for the distance type)."""
        if self.config.divergence != 'mass':
            return 0
        r = self.sampled.ys.shape[0]
        return int(round(min(1.0, self.sampled.mass / r) * r))

    def finetune(self, a, t, v_fn=None, small: bool = False):
        """The fine-tune from (a, t[, v_fn]): on the multi-start's sample (``small``) with its
        iteration cap, else the final one. Returns (a, t, v_fn, converged)."""
        tf = time.perf_counter()
        cfg = self.config
        out = finetune_stage(
            self.prob,
            cfg,
            self.small if small else self.data,
            (a, t, v_fn),
            self.h_caller,
            final=not small,
            max_iterations=cfg.start_finetune_iterations if small else None,
        )
        self.timings['finetune'] += time.perf_counter() - tf
        self.finetune_iterations += out.iterations
        if not small:
            self.capped = out.capped
        return out.a, out.t, out.v_fn, out.converged
