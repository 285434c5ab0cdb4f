"""ament_python build of pwan_ros (also a plain pip-installable package).

This file is the single list of the package's Python dependencies:
``install_requires`` for running, ``extras_require['test']`` for the test suite and
``extras_require['bench']`` for the benchmark anchors (other registration libraries).
ROS 2 itself (rclpy, message packages) comes from a system ROS install or from the
ROS wheels that ``tools/setup_env.sh`` installs; it is not listed here so that a
colcon build against a system ROS never tries to pip-install ROS.
"""

import glob
import os

from setuptools import find_packages, setup

package_name = 'pwan_ros'


def _files(pattern):
    return sorted(f for f in glob.glob(pattern) if os.path.isfile(f))


setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(include=[package_name, package_name + '.*']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        ('share/' + package_name + '/launch', _files('launch/*.py')),
        ('share/' + package_name + '/config', _files('config/*.yaml')),
        ('share/' + package_name + '/rviz', _files('rviz/*.rviz')),
    ],
    python_requires='>=3.10',
    install_requires=[
        'setuptools',
        'numpy>=1.23',
        'scipy>=1.10',
        'torch>=2.1',
        'open3d>=0.17',
        'rosbags>=0.10',
        'pot>=0.9',
        'matplotlib>=3.6',
        'pyyaml>=6',
        'evo>=1.20',
        'small-gicp>=1.0',
        'plyfile>=1.0',
        'python-neo-lzf>=0.3.5',  # PCL's binary_compressed PCD files
        # the adaptation safeguard's linear source-only candidate, on the run's threads
        'scikit-learn>=1.2',
        'threadpoolctl>=3.0',
    ],
    extras_require={
        # colcon builds the package in tests; osrf-pycommon, lark and psutil are what the ROS 2
        # launch tooling (../shared/ros2-launch, not on the index) needs from the index
        'test': [
            'pytest>=7',
            # `make test` runs the suite on 2 workers (--dist loadfile; groups: test/conftest.py)
            'pytest-xdist>=3.5',
            'hypothesis>=6',
            'colcon-core>=0.15',
            'colcon-ros>=0.4',
            'colcon-python-setup-py>=0.2',
            'osrf-pycommon>=2.0',
            'lark>=1.1',
            'psutil>=5.9',
            # `make test` checks the house style (ruff.toml) first; the formatter's output is only
            # stable within one ruff minor series, so the series that formatted the tree is pinned
            'ruff>=0.17,<0.18',
            # the anchor of every evaluation table (`make demo`, pwan_evaluate --offline) and the
            # fleet evaluation's local Ray (test/test_fleet.py)
            'kiss-icp>=1.0',
            'ray>=2.40',
        ],
        # pwan_evaluate --offline on Ray: sequences in parallel on this machine or a cluster
        'cluster': ['ray>=2.40'],
        'bench': [
            'kiss-matcher>=1.0',
            'probreg>=0.3',
            'pycpd>=2.0',
            # bench/bench_pda.py's library columns (kmm, dreweight); the package never imports it
            'skada>=0.6',
        ],
    },
    zip_safe=True,
    maintainer='pwan_ros maintainers',
    maintainer_email='maintainers@pwan-ros.dev',
    description='Robust point cloud registration with Partial Wasserstein Adversarial Networks '
    'for ROS 2',
    license='MIT',
    tests_require=['pytest'],
    entry_points={
        'console_scripts': [
            # one style: pwan_<job>; ROS nodes end in _node (valid `ros2 run pwan_ros NAME` names)
            'pwan_odometry_node = pwan_ros.ros.entry:odometry_node',
            'pwan_adapt_node = pwan_ros.ros.adapt_node:main',
            'pwan_classifier_node = pwan_ros.ros.entry:classifier_node',
            'pwan_register = pwan_ros.cli.register:main',
            'pwan_adapt = pwan_ros.cli.adapt:main',
            'pwan_adapt_import = pwan_ros.cli.adapt:import_main',
            'pwan_sim = pwan_ros.cli.sim:main',
            'pwan_replay = pwan_ros.cli.replay:main',
            'pwan_evaluate = pwan_ros.cli.evaluate:main',
            'pwan_pcd2bag = pwan_ros.cli.pcd2bag:main',
            'pwan_demo = pwan_ros.cli.demo:main',
        ],
    },
)
