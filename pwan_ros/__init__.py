"""pwan_ros: robust point cloud registration with Partial Wasserstein Adversarial Networks.

The package import is deliberately light (no torch, no ROS): the registration core lives in
:mod:`pwan_ros.core` and is imported on demand.
"""

__all__ = ['__version__']

__version__ = '0.1.0'
