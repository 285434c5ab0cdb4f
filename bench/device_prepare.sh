#!/usr/bin/env bash
# Prepares what a bare GPU machine of the device tool lacks, in one folder to carry (< 64 MiB):
#   bench/device_prepare.sh [--out DIR] [--data DIR] [--python 3.12]
# DIR (default .device_carry, git-ignored) then holds: whl/ (small_gicp for that Python),
# open3d.tar.xz (open3d-cpu without its TensorFlow/PyTorch ops, resources and examples),
# stub/ (empty plotly and dash: open3d.visualization imports them), libs/ (the system libraries
# libOpen3D links that a CUDA image may lack, from this machine), data/ (the datasets
# device_check.sh reads: the bunny scans, BALM, the bcpd fish / bunny / monkey pairs; pycpd in
# whl/ for the non-rigid anchor) and setup.sh, which device_check.sh --setup DIR sources there:
#   run(command='bash bench/device_check.sh --setup .device_carry', carry=['.device_carry'])
# POT is not carried (the registration never imports it), so --baseline cores that import it at
# module level (a9638ec) cannot run there.
set -eu
cd "$(dirname "$0")/.."
OUT=.device_carry
DATA=../shared/data
PYV=3.12
PIP=${PIP:-.venv/bin/pip}
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=${2:?}; shift 2 ;;
        --data) DATA=${2:?}; shift 2 ;;
        --python) PYV=${2:?}; shift 2 ;;
        *) echo "device_prepare: unknown argument $1 (--out, --data, --python)" >&2; exit 2 ;;
    esac
done
for d in rigid/stanford_bunny lidar/balm_seq_a nonrigid/bcpd; do
    [ -d "$DATA/$d" ] || { echo "device_prepare: $DATA/$d not found (--data)" >&2; exit 2; }
done
rm -rf "$OUT" && mkdir -p "$OUT"/{whl,stub/plotly,stub/dash,libs,data/rigid,data/lidar,data/nonrigid/bcpd}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=()
for p in manylinux_2_35 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014; do
    plat+=(--platform "${p}_x86_64")
done
"$PIP" download -q --only-binary=:all: --no-deps --python-version "$PYV" "${plat[@]}" \
    -d "$OUT/whl" small_gicp
"$PIP" download -q --only-binary=:all: --no-deps -d "$OUT/whl" pycpd  # pure Python, needs numpy
"$PIP" download -q --only-binary=:all: --no-deps -d "$OUT/whl" plyfile  # pure Python (PLY reads)
"$PIP" download -q --only-binary=:all: --no-deps --python-version "$PYV" "${plat[@]}" \
    -d "$tmp" open3d-cpu
(cd "$tmp" && unzip -q open3d_cpu-*.whl 'open3d/*')
tar -cJf "$OUT/open3d.tar.xz" -C "$tmp" --exclude=open3d/open3d_tf_ops.so \
    --exclude=open3d/open3d_torch_ops.so --exclude=open3d/resources --exclude=open3d/examples \
    --exclude=open3d/_ml3d open3d
: >"$OUT/stub/plotly/__init__.py"
: >"$OUT/stub/plotly/graph_objects.py"
printf 'html = dcc = None\n\n\nclass Dash:\n    pass\n' >"$OUT/stub/dash/__init__.py"
ldd "$tmp"/open3d/libOpen3D.so.* | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so* | libm.so* | libstdc++* | libgcc_s* | libpthread* | libdl.so* | librt.so*) ;;
        libtbb*) ;;
        *) cp -L "$lib" "$OUT/libs/" ;;
    esac
done
cp -r "$DATA/rigid/stanford_bunny" "$OUT/data/rigid/"
cp -r "$DATA/lidar/balm_seq_a" "$OUT/data/lidar/"
cp "$DATA"/nonrigid/bcpd/{fish,bunny,monkey}-[xy].txt "$OUT/data/nonrigid/bcpd/"
cat >"$OUT/setup.sh" <<'SETUP'
# sourced by device_check.sh --setup DIR on the device machine (DIR in $SETUP_DIR)
python3 -m pip install -q --no-deps --no-index "$SETUP_DIR"/whl/*.whl
mkdir -p /tmp/pwan_o3d /tmp/pwan_libs
tar -xJf "$SETUP_DIR/open3d.tar.xz" -C /tmp/pwan_o3d
for f in "$SETUP_DIR"/libs/*; do  # only what the image lacks
    ldconfig -p | grep -q "[[:space:]]$(basename "$f") " || cp "$f" /tmp/pwan_libs/
done
export LD_LIBRARY_PATH=/tmp/pwan_libs:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$PWD:/tmp/pwan_o3d:$SETUP_DIR/stub:${PYTHONPATH:-}
SETUP
du -sh "$OUT"
size=$(du -sm "$OUT" | cut -f1)
[ "$size" -lt 60 ] || echo "device_prepare: $OUT is ${size} MiB: with the repository it may pass the 64 MiB the device tool carries" >&2
