"""Rigid transforms: one pose/quaternion convention (REP-103, x y z w quaternions)."""
