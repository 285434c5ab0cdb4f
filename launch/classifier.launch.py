"""Launch the adapted classifier (executable pwan_classifier_node, node pwan_classifier).

  ros2 launch pwan_ros classifier.launch.py model:=/data/adapt_out/model.ts \
      features:=/camera/features

Subscribes the ``features`` argument's topic (std_msgs/Float32MultiArray, one feature vector per
message) and publishes ``class_id`` (std_msgs/Int32), ``confidence`` (std_msgs/Float32) and, when
the run recorded class names, ``class_name`` (std_msgs/String) for every valid message, plus
``prediction`` (std_msgs/String, JSON naming the input it answers); counts of received, classified,
skipped and dropped inputs go to /diagnostics. A model or parameter the node refuses (one line)
ends the launch with exit code 1.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from pwan_ros.ros.launching import required


def generate_launch_description():
    args = [
        DeclareLaunchArgument(
            'model', description='model.ts written by pwan_adapt / pwan_adapt_node'
        ),
        DeclareLaunchArgument(
            'features',
            default_value='features',
            description='input std_msgs/Float32MultiArray topic',
        ),
        DeclareLaunchArgument(
            'device', default_value='auto', description='auto | cpu | cuda | cuda:N'
        ),
    ]
    node = Node(
        package='pwan_ros',
        executable='pwan_classifier_node',
        name='pwan_classifier',
        output='screen',
        emulate_tty=True,
        parameters=[
            {'model': LaunchConfiguration('model'), 'device': LaunchConfiguration('device')}
        ],
        remappings=[('features', LaunchConfiguration('features'))],
    )
    return LaunchDescription(args + [node, required(node, 'pwan_classifier_node')])
