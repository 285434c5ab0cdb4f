"""Atomic file writes for the adaptation outputs (see :mod:`pwan_ros.atomic_io`)."""
from ..atomic_io import atomic_path, write_json, write_npy, write_text

__all__ = ['atomic_path', 'write_json', 'write_npy', 'write_text']
