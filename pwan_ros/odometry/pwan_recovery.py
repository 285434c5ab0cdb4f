"""The full-PWAN path of the scan pipeline: an adapter from OdometryConfig to the core.

Builds the core's RegistrationConfig once from the node parameters (same names), caps the
point sets at ``pwan_max_points``, warm-starts from the motion prediction and — in
``mode='pwan'`` — from the previous scan's potential network weights.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import numpy as np

from pwan_ros.core import RegistrationConfig, RegistrationResult, register
from pwan_ros.odometry.config import OdometryConfig


def core_config(cfg: OdometryConfig, h: Optional[float] = None) -> RegistrationConfig:
    """The core configuration for the node parameters. h: distance threshold in metres
    (d-PWAN and the fine-tune stage), None = the core's automatic choice."""
    return RegistrationConfig(
        transform=cfg.transform, divergence=cfg.divergence, mass_ratio=cfg.mass_ratio,
        distance_threshold=h, max_points=cfg.pwan_max_points, steps=cfg.steps,
        potential_updates=cfg.potential_updates, device=cfg.device, seed=cfg.seed)


class PwanAligner:
    """Runs PWAN between two clouds in metres; keeps the potential for warm starts."""

    def __init__(self, config: OdometryConfig):
        self.config = config
        self._state: Optional[dict] = None
        self._cancel = threading.Event()

    def align(self, source: np.ndarray, reference: np.ndarray, init: np.ndarray,
              h: Optional[float] = None, deadline: Optional[float] = None) -> RegistrationResult:
        """Register source (N, 3) onto reference (M, 3), both metres, from ``init`` (4x4
        T_reference_source). ``deadline`` (time.perf_counter() seconds) ends the adversarial
        stage early, as does :meth:`cancel`. Returns the core result (``transform`` maps
        source -> reference)."""
        warm = self._state if self.config.mode == 'pwan' else None

        def should_stop() -> bool:
            return self._cancel.is_set() or (deadline is not None and time.perf_counter() > deadline)

        result = register(source, reference, core_config(self.config, h), init=init,
                          potential_state=warm, should_stop=should_stop)
        self._state = result.potential_state
        return result

    def reset(self) -> None:
        self._state = None

    def cancel(self) -> None:
        """Make the running and all later registrations stop at their next step (shutdown)."""
        self._cancel.set()
