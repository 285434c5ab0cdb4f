"""Launch PWAN odometry (executable pwan_odometry_node, node pwan_odometry).

  ros2 launch pwan_ros odometry.launch.py [params_file:=FILE] [points:=/topic] [use_sim_time:=true]
                                          [device:=auto|cpu|cuda|cuda:N]

``device`` overrides the config file only when given; by default the file's ``device`` holds.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def _node(context):
    overrides = {'use_sim_time': LaunchConfiguration('use_sim_time').perform(context).lower() == 'true'}
    device = LaunchConfiguration('device').perform(context)
    if device:
        overrides['device'] = device
    return [Node(
        package='pwan_ros',
        executable='pwan_odometry_node',
        name='pwan_odometry',
        output='screen',
        parameters=[LaunchConfiguration('params_file').perform(context), overrides],
        remappings=[('points', LaunchConfiguration('points'))],
    )]


def generate_launch_description():
    default_config = os.path.join(get_package_share_directory('pwan_ros'), 'config', 'odometry.yaml')
    return LaunchDescription([
        DeclareLaunchArgument('params_file', default_value=default_config,
                              description='ROS parameter file of the pwan_odometry node'),
        DeclareLaunchArgument('points', default_value='/points',
                              description='input sensor_msgs/PointCloud2 topic'),
        DeclareLaunchArgument('use_sim_time', default_value='false',
                              description='use /clock (e.g. when replaying a bag)'),
        DeclareLaunchArgument('device', default_value='',
                              description="auto | cpu | cuda | cuda:N; '' (default) = the config file's"),
        # Large clouds between processes: Fast DDS's large-data transports (no effect on
        # other middlewares).
        SetEnvironmentVariable('FASTDDS_BUILTIN_TRANSPORTS', 'LARGE_DATA'),
        OpaqueFunction(function=_node),
    ])
