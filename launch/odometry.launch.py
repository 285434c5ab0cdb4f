"""Launch PWAN odometry under the node's name: the same launch as ``register.launch.py`` (the
package's entry point), which declares the arguments (params_file, points, base_frame,
odom_frame, publish_tf, device, use_sim_time, bagfile, rviz): see that file's docstring.

  ros2 launch pwan_ros odometry.launch.py points:=/ouster/points base_frame:=base_link
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource


def generate_launch_description():
    launch_dir = os.path.join(get_package_share_directory('pwan_ros'), 'launch')
    return LaunchDescription(
        [
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(os.path.join(launch_dir, 'register.launch.py'))
            ),
        ]
    )
