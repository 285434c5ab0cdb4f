"""Launch adapt_node (offline partial domain adaptation) with config/adapt.yaml.

  ros2 launch pwan_ros adapt.launch.py labelled:=/data/lab.npz unlabelled:=/data/unl.npz \
      output:=/data/adapt_out [params_file:=my.yaml]

The node trains, publishes progress on /diagnostics, writes its outputs and exits; Ctrl-C stops it
with a checkpoint (relaunch with resume:=true to continue).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory('pwan_ros'), 'config', 'adapt.yaml')
    args = [
        DeclareLaunchArgument(
            'params_file', default_value=default_params, description='parameter YAML'
        ),
        DeclareLaunchArgument('labelled', description='.npz with labelled features'),
        DeclareLaunchArgument('unlabelled', description='.npz with unlabelled features'),
        DeclareLaunchArgument('output', description='output directory'),
        DeclareLaunchArgument(
            'resume', default_value='false', description='continue from the latest checkpoint'
        ),
    ]
    node = Node(
        package='pwan_ros',
        executable='pwan_adapt_node',
        name='adapt_node',
        output='screen',
        emulate_tty=True,
        parameters=[
            LaunchConfiguration('params_file'),
            {
                'labelled': LaunchConfiguration('labelled'),
                'unlabelled': LaunchConfiguration('unlabelled'),
                'output': LaunchConfiguration('output'),
                'resume': LaunchConfiguration('resume'),
            },
        ],
    )
    return LaunchDescription(args + [node])
