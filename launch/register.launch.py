"""Launch PWAN odometry (executable pwan_odometry_node, node pwan_odometry): the package's entry
point. ``odometry.launch.py`` is the same launch under the node's name.

  ros2 launch pwan_ros register.launch.py points:=/ouster/points base_frame:=base_link   # robot
  ros2 launch pwan_ros register.launch.py bagfile:=my_bag rviz:=true                      # bag

Arguments (``ros2 launch pwan_ros register.launch.py --show-args``):

  params_file   ROS parameter file of the node (default: the installed config/odometry.yaml);
                its section for the node is keyed ``pwan_odometry`` (also in a namespace),
                ``/NS/pwan_odometry`` or ``/**``
  namespace     ROS namespace of the node ('' default: none); its relative topics (odometry,
                aligned_points and a relative ``points``) move into it; /tf, /tf_static and
                /diagnostics stay global: give each robot its own ``odom_frame`` and
                ``base_frame``
  points        input sensor_msgs/PointCloud2 topic, remapped onto the node's ``points``
                (default /points)
  base_frame    node parameter override; '' (default) = the params file's value
  odom_frame    node parameter override; '' (default) = the params file's value (also rviz's
                fixed frame when given)
  publish_tf    node parameter override, true | false; '' (default) = the params file's value
  device        node parameter override, auto | cpu | cuda | cuda:N; '' (default) = the
                params file's value
  mode          node parameter override, adaptive | tracking | pwan (PWAN every scan: the
                mode for a GPU, device:=cuda); '' (default) = the params file's value
  use_sim_time  true | false; '' (default) = true when ``bagfile`` is given, else the params
                file's value (applies to the node and rviz2)
  bagfile       rosbag2 to replay: also runs ``ros2 bag play BAGFILE`` once the node says it is
                ready (a second later, for discovery), with ``--clock`` unless
                the bag records /clock itself (the bags of pwan_sim and pwan_pcd2bag do);
                '' (default) = play nothing
  rviz          true | false (default false): also start rviz2 with the installed
                rviz/pwan_odometry.rviz (fixed frame odom; input cloud, aligned cloud,
                odometry, TF)

Nothing is started when a requested part cannot run: a ``params_file`` that is no file, not
YAML or has no section for the node, a ``bagfile`` that does not exist, ``bagfile`` without
ros2bag installed, or ``rviz:=true`` without rviz2 stop the launch with one error line and exit
code 1 before any process starts. A node that refuses its parameters (one line naming the
problem) ends the launch with exit code 1 (``ros2 launch`` itself would return 0). An argument
name close to one of the above (``base_fram:=...``) is warned about: ``ros2 launch`` ignores
arguments it does not know.

The node's parameters are the params file (in a namespace also its ``pwan_odometry`` section,
which rcl would apply only to ``/pwan_odometry``) and the override arguments, each passed only
when given (``use_sim_time`` also with a bag), so the file's values hold under launch.
KISS-ICP users: ``topic`` is ``points`` here, ``visualize`` is ``rviz``, ``lidar_odom_frame``
is ``odom_frame``, ``publish_odom_tf`` is ``publish_tf``, ``config_file`` is ``params_file``.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import (
    DeclareLaunchArgument,
    ExecuteProcess,
    OpaqueFunction,
    SetEnvironmentVariable,
)
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from pwan_ros.params import ODOMETRY_READY, POINTS_TOPIC
from pwan_ros.ros.launching import after_output, required, warn_misspelled

PACKAGE = 'pwan_ros'
NODE = 'pwan_odometry'
#: the launch arguments (generate_launch_description declares them in this order)
ARGUMENTS = (
    'params_file',
    'namespace',
    'points',
    'base_frame',
    'odom_frame',
    'publish_tf',
    'device',
    'mode',
    'use_sim_time',
    'bagfile',
    'rviz',
)
_TRUE = ('true', '1')
_FALSE = ('false', '0')


def _arg(context, name):
    return LaunchConfiguration(name).perform(context).strip()


def _flag(context, name, unset=None):
    """A boolean launch argument; ``unset`` when given as ''."""
    value = _arg(context, name)
    if value == '' and unset is not None:
        return unset
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"launch argument {name}:={value!r}: expected true or false")


def _installed(package):
    try:
        get_package_share_directory(package)
        return True
    except LookupError:  # ament_index_python's PackageNotFoundError is a KeyError
        return False


def _bag_records_clock(bagfile):
    """Whether the rosbag2 directory's metadata.yaml lists a /clock topic."""
    metadata = os.path.join(bagfile, 'metadata.yaml')
    if not os.path.isfile(metadata):
        return False
    import yaml

    with open(metadata, encoding='utf-8') as f:
        info = (yaml.safe_load(f) or {}).get('rosbag2_bagfile_information', {})
    return any(
        t.get('topic_metadata', {}).get('name') == '/clock'
        for t in info.get('topics_with_message_count', [])
    )


def _node_parameters(params_file, namespace):
    """What of ``params_file`` the node gets: ``[params_file]``, and in a namespace also the
    parameters of its section keyed by the plain node name (rcl matches keys against the full
    name ``/NS/pwan_odometry``, so the installed file's ``pwan_odometry:`` section would not
    apply there). RuntimeError, one line, when the file cannot be used: no file, not YAML, or
    no section for the node (its name, its full name, or a pattern with ``*``)."""
    import yaml

    if not os.path.isfile(params_file):
        why = 'is a directory' if os.path.isdir(params_file) else 'no such file'
        raise RuntimeError(f'params_file:={params_file}: {why}')
    try:
        with open(params_file, encoding='utf-8') as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RuntimeError(f'params_file:={params_file}: not a YAML file ({exc})') from None
    if not isinstance(data, dict):
        raise RuntimeError(f'params_file:={params_file}: not a ROS parameter file (no mapping)')
    full = '/' + '/'.join(p for p in (namespace.strip('/'), NODE) if p)
    plain = [k for k in data if '/' + str(k).strip('/') == '/' + NODE]
    if not any('*' in str(k) or '/' + str(k).strip('/') == full for k in data) and not plain:
        raise RuntimeError(
            f'params_file:={params_file} has no section for node {full} (its keys: '
            f"{', '.join(map(str, data)) or 'none'}): key it '{NODE}:' or '/**:'"
        )
    if full == '/' + NODE or not plain:
        return [params_file]
    section = data[plain[0]]
    values = section.get('ros__parameters', {}) if isinstance(section, dict) else {}
    return [params_file, dict(values)]


def _check(context, bagfile):
    """Refuse, before anything starts, what cannot run (one line: ros2 launch prints it)."""
    if bagfile and not os.path.exists(bagfile):
        raise RuntimeError(f'bagfile:={bagfile}: no such bag')
    if bagfile and not _installed('ros2bag'):
        raise RuntimeError(
            f'bagfile:={bagfile} needs `ros2 bag` (package ros2bag), which is not '
            'installed; play the bag another way (e.g. pwan_replay) or install it'
        )
    if _flag(context, 'rviz') and not _installed('rviz2'):
        raise RuntimeError(
            'rviz:=true needs rviz2, which is not installed; launch without it or install it'
        )


def _actions(context):
    share = get_package_share_directory(PACKAGE)
    warn_misspelled(context, ARGUMENTS, 'register.launch.py')
    bagfile = _arg(context, 'bagfile')
    _check(context, bagfile)
    parameters = _node_parameters(_arg(context, 'params_file'), _arg(context, 'namespace'))
    # '' = true with a bag, else the params file's value (None: not passed)
    given = _arg(context, 'use_sim_time') != ''
    use_sim_time = _flag(context, 'use_sim_time') if given else (True if bagfile else None)

    # only the arguments the user gave override the params file
    overrides = {} if use_sim_time is None else {'use_sim_time': use_sim_time}
    for name in ('base_frame', 'odom_frame', 'device', 'mode'):
        value = _arg(context, name)
        if value:
            overrides[name] = value
    if _arg(context, 'publish_tf'):
        overrides['publish_tf'] = _flag(context, 'publish_tf')

    node = Node(
        package=PACKAGE,
        executable='pwan_odometry_node',
        name=NODE,
        namespace=_arg(context, 'namespace'),
        output='screen',
        parameters=[*parameters, overrides],
        remappings=[('points', _arg(context, 'points'))],
    )
    actions = [node, required(node, 'pwan_odometry_node')]
    if bagfile:
        # started once the node is ready (it loads for seconds: a bag played at once lost its
        # first scans, all of a short one), after a second for DDS discovery
        play = ['ros2', 'bag', 'play', bagfile, '--delay', '1']
        if not _bag_records_clock(bagfile):  # one /clock: the bag's own, else the player's
            play.append('--clock')
        player = ExecuteProcess(cmd=play, output='screen')
        actions.append(after_output(node, ODOMETRY_READY, [player]))
    if _flag(context, 'rviz'):
        rviz_args = ['-d', os.path.join(share, 'rviz', 'pwan_odometry.rviz')]
        if 'odom_frame' in overrides:
            rviz_args += ['-f', overrides['odom_frame']]
        actions.append(
            Node(
                package='rviz2',
                executable='rviz2',
                name='rviz2',
                output='screen',
                arguments=rviz_args,
                parameters=[{'use_sim_time': bool(use_sim_time)}],
            )
        )
    return actions


def generate_launch_description():
    default_config = os.path.join(get_package_share_directory(PACKAGE), 'config', 'odometry.yaml')
    keep = "; '' (default) = the params file's value"
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                'params_file',
                default_value=default_config,
                description='ROS parameter file of the pwan_odometry node',
            ),
            DeclareLaunchArgument(
                'namespace',
                default_value='',
                description="ROS namespace of the node; '' (default) = none",
            ),
            DeclareLaunchArgument(
                'points',
                default_value=POINTS_TOPIC,
                description='input sensor_msgs/PointCloud2 topic',
            ),
            DeclareLaunchArgument(
                'base_frame',
                default_value='',
                description='moving frame of the published pose' + keep,
            ),
            DeclareLaunchArgument(
                'odom_frame',
                default_value='',
                description='fixed frame of the published pose' + keep,
            ),
            DeclareLaunchArgument(
                'publish_tf',
                default_value='',
                description='broadcast odom_frame -> base_frame on /tf: true | false' + keep,
            ),
            DeclareLaunchArgument(
                'device', default_value='', description='auto | cpu | cuda | cuda:N' + keep
            ),
            DeclareLaunchArgument(
                'mode',
                default_value='',
                description='adaptive | tracking | pwan (PWAN every scan, for a GPU)' + keep,
            ),
            DeclareLaunchArgument(
                'use_sim_time',
                default_value='',
                description="use /clock: true | false; '' (default) = true when bagfile is "
                "given, else the params file's value",
            ),
            DeclareLaunchArgument(
                'bagfile',
                default_value='',
                description="rosbag2 to play with `ros2 bag play BAGFILE` (--clock unless it "
                "records /clock); '' = none",
            ),
            DeclareLaunchArgument(
                'rviz',
                default_value='false',
                description='start rviz2 with rviz/pwan_odometry.rviz: true | false',
            ),
            # Large clouds between processes: Fast DDS's large-data transports for everything
            # launched below (node, bag player, rviz2); no effect on other middlewares.
            SetEnvironmentVariable('FASTDDS_BUILTIN_TRANSPORTS', 'LARGE_DATA'),
            OpaqueFunction(function=_actions),
        ]
    )
