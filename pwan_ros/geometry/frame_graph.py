"""Static transforms between named frames, composed through chains of edges (a tiny /tf_static)."""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from pwan_ros.geometry.se3 import from_quaternion, invert


class FrameGraph:
    """Rigid transforms between frames, looked up through any chain of known edges.

    Thread-safe: one thread may ``add`` while another calls ``lookup``."""

    def __init__(self):
        self._edges: Dict[Tuple[str, str], np.ndarray] = {}
        self._lock = threading.Lock()

    def add(self, parent: str, child: str, t_parent_child: np.ndarray) -> None:
        """Record (4, 4) ``T_parent_child`` (maps points in ``child`` into ``parent``); a later
        edge between the same frames replaces the earlier one. Leading slashes are ignored."""
        with self._lock:
            self._edges[(parent.lstrip('/'), child.lstrip('/'))] = np.asarray(
                t_parent_child, dtype=np.float64
            )

    def add_message(self, msg, invalid: Dict[Tuple[str, str], str]) -> None:
        """Record the transforms of a /tf_static message (tf2_msgs/TFMessage, from rclpy or a
        bag); an invalid one (zero or non-finite quaternion, non-finite translation) is skipped
        and its reason kept in ``invalid`` under (parent, child), for the warning of the scans
        that need it."""
        for t in msg.transforms:
            r, tr = t.transform.rotation, t.transform.translation
            key = (t.header.frame_id.lstrip('/'), t.child_frame_id.lstrip('/'))
            try:
                if not np.isfinite([tr.x, tr.y, tr.z]).all():
                    raise ValueError(f'non-finite translation {[tr.x, tr.y, tr.z]}')
                m = from_quaternion((r.x, r.y, r.z, r.w), (tr.x, tr.y, tr.z))
            except ValueError as exc:
                invalid[key] = str(exc)
                continue
            invalid.pop(key, None)
            self.add(t.header.frame_id, t.child_frame_id, m)

    def lookup(self, target: str, source: str) -> Optional[np.ndarray]:
        """(4, 4) ``T_target_source`` (maps points in ``source`` into ``target``), or None if no
        chain of edges connects them."""
        target, source = target.lstrip('/'), source.lstrip('/')
        if target == source:
            return np.eye(4)
        with self._lock:
            edges = list(self._edges.items())
        graph: Dict[str, List[Tuple[str, np.ndarray]]] = {}
        for (p, c), m in edges:
            graph.setdefault(p, []).append((c, m))  # T_p_c
            graph.setdefault(c, []).append((p, invert(m)))  # T_c_p
        frontier, seen = [(target, np.eye(4))], {target}
        while frontier:
            frame, t_target_frame = frontier.pop()
            for nxt, t_frame_nxt in graph.get(frame, ()):
                if nxt in seen:
                    continue
                t = t_target_frame @ t_frame_nxt
                if nxt == source:
                    return t
                seen.add(nxt)
                frontier.append((nxt, t))
        return None
