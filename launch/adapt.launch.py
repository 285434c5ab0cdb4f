"""Launch adapt_node (offline partial domain adaptation) with config/adapt.yaml.

  ros2 launch pwan_ros adapt.launch.py labelled:=/data/lab.npz unlabelled:=/data/unl.npz \
      output:=/data/adapt_out [params_file:=my.yaml]

The node trains, publishes progress on /diagnostics, writes its outputs and exits; Ctrl-C stops it
with a checkpoint (relaunch with resume:=true to continue). Inputs or parameters the node refuses
(one line) end the launch with exit code 1.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from pwan_ros.adaptation.config import AdaptIO
from pwan_ros.params import specs
from pwan_ros.ros.launching import required

#: the run's inputs and outputs, passed to the node over the params file's values
IO_ARGUMENTS = ('labelled', 'unlabelled', 'output', 'resume')


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory('pwan_ros'), 'config', 'adapt.yaml')
    io = specs(AdaptIO)
    args = [
        DeclareLaunchArgument(
            'params_file', default_value=default_params, description='parameter YAML'
        ),
        DeclareLaunchArgument('labelled', description=io['labelled'][1].description),
        DeclareLaunchArgument('unlabelled', description=io['unlabelled'][1].description),
        DeclareLaunchArgument('output', description=io['output'][1].description),
        DeclareLaunchArgument(
            'resume', default_value='false', description=io['resume'][1].description
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
            {name: LaunchConfiguration(name) for name in IO_ARGUMENTS},
        ],
    )
    return LaunchDescription(args + [node, required(node, 'pwan_adapt_node')])
