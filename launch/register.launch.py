"""Launch the pwan_register node.

  ros2 launch pwan_ros register.launch.py [config:=FILE] [points:=/topic] [use_sim_time:=true]
                                          [device:=auto|cpu|cuda]
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue


def generate_launch_description():
    default_config = os.path.join(get_package_share_directory('pwan_ros'), 'config', 'register.yaml')
    return LaunchDescription([
        DeclareLaunchArgument('config', default_value=default_config,
                              description='YAML parameter file of the pwan_register node'),
        DeclareLaunchArgument('points', default_value='/points',
                              description='input sensor_msgs/PointCloud2 topic'),
        DeclareLaunchArgument('use_sim_time', default_value='false',
                              description='use /clock (e.g. when replaying a bag)'),
        DeclareLaunchArgument('device', default_value='auto',
                              description='auto | cpu | cuda | cuda:N (overrides the config file)'),
        # Large clouds between processes: Fast DDS's large-data transports (no effect on
        # other middlewares).
        SetEnvironmentVariable('FASTDDS_BUILTIN_TRANSPORTS', 'LARGE_DATA'),
        Node(
            package='pwan_ros',
            executable='register_node',
            name='pwan_register',
            output='screen',
            parameters=[LaunchConfiguration('config'),
                        {'use_sim_time': ParameterValue(LaunchConfiguration('use_sim_time'),
                                                        value_type=bool),
                         'device': ParameterValue(LaunchConfiguration('device'), value_type=str)}],
            remappings=[('points', LaunchConfiguration('points'))],
        ),
    ])
