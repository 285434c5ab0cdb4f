#!/usr/bin/env bash
# The CUDA path checked in one step, then one table (each step under a limit: 180 + 150 + 200 +
# 150 s on one GPU; about 7 minutes in all on an H200):
#   1. the device tests (test/test_core_device.py with PWAN_TEST_DEVICE = the device),
#   2. bench/bench_engine.py: one start and the 24-start tournament (starts=24, start_steps=60),
#      wall seconds, rotation error, GFLOP/s of the adversarial stage next to a plain bmm, the
#      fine-tune's seconds,
#   3. bench/bench_lidar.py --pwan-only: the odometry pipeline in pwan mode, PWAN on the device,
#   4. bench/bench_nonrigid.py protocol (a), outlier ratio 0.6, one draw of fish, bunny, monkey:
#      non-rigid PWAN on the device next to pycpd on the host CPU (seconds per pair, MSE).
#   cpd (not in the default set, --steps cpd, about 2 minutes on an H200): the comparison with CPD
#      where CPD works: bench_nonrigid.py protocols (a) (ratios 0.2 0.6 1.2) and (b) (s = 0.7 0.85
#      1.0) with the pairs' rotation removed, one rigid start, one draw, next to pycpd on the host.
# On a GPU, steps 2-3 also run with compile=on side by side (torch.compile; default off); step 4
# does not (its 13-40 s graph build per shape ran it past its limit on an H200).
#
#   bench/device_check.sh [--device cuda|cuda:N|cpu] [--quick] [--data DIR] [--results DIR]
#                         [--baseline CHECKOUT] [--setup DIR] [--steps tests,engine,odometry,nonrigid,cpd]
#
# On a GPU the engine also runs on the CPU (1 thread) in the same process, and with --baseline the
# core of another checkout on the device: the speed-up column is wall seconds of the first over this.
# --setup DIR: a folder made by bench/device_prepare.sh (open3d, small_gicp, the data) for a bare
# GPU machine of the device tool; its setup.sh runs first and its data/ is the default --data.
# --device cpu is the dry run of the script itself (implies --quick: small sizes); --quick: small
# sizes on any device. --steps: a comma list of the steps to run (default all four; a short device
# budget runs the part not yet measured). Exits 2 with one line when the device is CUDA and torch sees none; 1 when a
# step failed (the table says which).
set -u
cd "$(dirname "$0")/.."
DEVICE=cuda
QUICK=0
DATA=../shared/data
RESULTS=results/device_check
BASELINE=
SETUP=
STEPS=tests,engine,odometry,nonrigid
PY=${PYTHON:-python}
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=${2:?--device needs a value}; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --data) DATA=${2:?--data needs a value}; shift 2 ;;
        --results) RESULTS=${2:?--results needs a value}; shift 2 ;;
        --baseline) BASELINE=${2:?--baseline needs a value}; shift 2 ;;
        --setup) SETUP=${2:?--setup needs a value}; shift 2 ;;
        --steps) STEPS=${2:?--steps needs a value}; shift 2 ;;
        *) echo "device_check: unknown argument $1 (--device, --quick, --data, --results, --baseline, --setup, --steps)" >&2; exit 2 ;;
    esac
done
if [ -n "$SETUP" ]; then
    [ -f "$SETUP/setup.sh" ] || { echo "device_check: $SETUP/setup.sh not found (bench/device_prepare.sh makes it)" >&2; exit 2; }
    SETUP_DIR=$(cd "$SETUP" && pwd)
    # shellcheck source=/dev/null
    . "$SETUP_DIR/setup.sh" || { echo "device_check: $SETUP/setup.sh failed" >&2; exit 2; }
    [ "$DATA" = ../shared/data ] && DATA=$SETUP_DIR/data
    PY=${PYTHON:-python3}
fi
for s in ${STEPS//,/ }; do
    case "$s" in
        tests | engine | odometry | nonrigid | cpd) ;;
        *) echo "device_check: --steps takes tests, engine, odometry, nonrigid, cpd; got $s" >&2; exit 2 ;;
    esac
done
case "$DEVICE" in
    cpu) QUICK=1 ;;
    cuda | cuda:[0-9]*)
        if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
            echo "device_check: no CUDA device (torch.cuda.is_available() is False); --device cpu is the dry run" >&2
            exit 2
        fi ;;
    *) echo "device_check: --device must be cuda, cuda:N or cpu, got $DEVICE" >&2; exit 2 ;;
esac
if [ ! -d "$DATA/rigid/stanford_bunny" ] || [ ! -d "$DATA/lidar/balm_seq_a" ]; then
    echo "device_check: $DATA has no rigid/stanford_bunny or lidar/balm_seq_a (--data)" >&2
    exit 2
fi
mkdir -p "$RESULTS"
export OMP_NUM_THREADS=1 PWAN_TEST_DEVICE="$DEVICE"
# time limits per step (s) for one GPU; the CPU dry run is slower
SCALE=1
[ "$DEVICE" = cpu ] && SCALE=4
if [ "$QUICK" = 1 ]; then
    ENGINE=(--points 300 --repeats 1)
    LIDAR=(--max-scans 3)
    NONRIGID=(--shapes fish)
else
    ENGINE=(--points 2000 --repeats 1)
    LIDAR=()
    NONRIGID=(--shapes fish bunny monkey)
fi
# on a GPU the engine and odometry also run compiled (compile=on: torch.compile's
# graph build per shape set; the default replays CUDA graphs of eager kernels) side by side, and
# the engine on the CPU (--also cuda_graphs=false compares launched steps instead)
if [ "$DEVICE" != cpu ]; then
    ENGINE+=(--cpu-side --also compile=on)
    LIDAR+=(--also compile=on)
fi
[ -n "$BASELINE" ] && ENGINE+=(--baseline "$BASELINE")

# step NAME LIMIT_S COMMAND...: runs it with a time limit, its output in $RESULTS/NAME.log
step() {
    local name=$1 limit=$2
    shift 2
    case ",$STEPS," in *",$name,"* | *",${name%-*},"*) ;; *) return 0 ;; esac
    local t0=$SECONDS
    echo "[device_check] $name ..." >&2
    timeout "$((limit * SCALE))" "$@" >"$RESULTS/$name.log" 2>&1
    echo "$name $? $((SECONDS - t0))" >>"$RESULTS/steps.txt"
}
rm -f "$RESULTS/steps.txt"
step tests 180 "$PY" -m pytest -q -p no:cacheprovider test/test_core_device.py \
    --junitxml="$RESULTS/tests.xml"
step engine 150 "$PY" bench/bench_engine.py --device "$DEVICE" --data "$DATA" \
    --results "$RESULTS" "${ENGINE[@]}"
step odometry 200 "$PY" bench/bench_lidar.py --pwan-only --device "$DEVICE" --data "$DATA" \
    --results "$RESULTS" "${LIDAR[@]}"
step nonrigid 150 "$PY" bench/bench_nonrigid.py --protocol a --ratios 0.6 --runs 1 \
    --methods pwan pycpd --device "$DEVICE" --data "$DATA" --results "$RESULTS" "${NONRIGID[@]}"
# cpd: where CPD from identity works (rotation removed, one rigid start), both protocols
step cpd-a 150 "$PY" bench/bench_nonrigid.py --protocol a --ratios 0.2 0.6 1.2 --unrotate \
    --starts 1 --runs 1 --methods pwan pycpd --device "$DEVICE" --data "$DATA" \
    --results "$RESULTS" "${NONRIGID[@]}"
step cpd-b 150 "$PY" bench/bench_nonrigid.py --protocol b --ratios 0.7 0.85 1.0 --unrotate \
    --starts 1 --runs 1 --methods pwan pycpd --device "$DEVICE" --data "$DATA" \
    --results "$RESULTS" "${NONRIGID[@]}"

"$PY" - "$RESULTS" "$DEVICE" <<'EOF'
import json, os, sys
import xml.etree.ElementTree as ET

res, device = sys.argv[1], sys.argv[2]
steps = {}
for line in open(os.path.join(res, 'steps.txt')):
    name, rc, sec = line.split()
    steps[name] = (int(rc), int(sec))


def status(name):
    rc = steps[name][0]
    return 'ok' if rc == 0 else ('timed out' if rc == 124 else f'failed (rc {rc})')


def tests_rows():
    try:
        suite = ET.parse(os.path.join(res, 'tests.xml')).getroot().find('testsuite')
        n, bad = int(suite.get('tests')), int(suite.get('failures')) + int(suite.get('errors'))
        detail = f'{n - bad}/{n} passed'
    except (OSError, ET.ParseError, AttributeError, TypeError):
        detail = 'no test report'
    return [('device tests', status('tests'), steps['tests'][1], detail)]


def engine_rows():
    rows = []
    out = json.load(open(os.path.join(res, 'bench_engine.json')))
    floor = next(s['matmul_gflops'] for s in out['summary'] if 'matmul_gflops' in s)
    for s in out['summary']:
        if 'case' not in s or 'warmup_s' in s:
            continue
        name = 'engine ' + ('24-start tournament' if s['case'] == 'tournament' else 'one start')
        detail = (
            f"{s['core']} on {s['device']}: rot err {s['rot_err_deg']:.3f} deg, "
            f"fine-tune {s['finetune_s']:.2f} s"
        )
        if 'speedup' in s:
            detail += f", speed-up {s['speedup']:.2f}x"
        if 'gflops' in s:
            detail += f", {s['gflops']:.1f} GFLOP/s"
        rows.append((name, status('engine'), round(s['wall_s'], 2), detail))
    for s in out['summary']:
        if 'warmup_s' in s:
            rows.append((f"engine first registration ({s['case']})", status('engine'),
                         round(s['warmup_s'], 1), f"{s['core']}: first step's capture + compile if on"))
    rows.append(('engine bmm floor', status('engine'), '', f'{floor:.1f} GFLOP/s on {device}'))
    return rows


def odometry_rows():
    rows = []
    out = json.load(open(os.path.join(res, 'bench_lidar.json')))
    for label in ('clean', 'robust'):
        for r in out[label]:
            rows.append(
                (
                    f"odometry {r['method'].removeprefix('pwan_ros ')}, {label}",
                    status('odometry'),
                    round(r['latency_median_ms'] / 1e3, 2),
                    f"{r['success']}/{r['pairs']} pairs ok, rot med {r['rot_median_deg']:.3f} deg, "
                    f"tr med {r['trans_median_mm']:.1f} mm (wall s = median per scan)",
                )
            )
    return rows


def nonrigid_rows():
    rows = []
    summ = json.load(open(os.path.join(res, 'bench_nonrigid_a.json')))['summary']
    warm = {(s['shape'], s['ratio'], s['method']): s['warmup_s'] for s in summ if 'warmup_s' in s}
    by = {(s['shape'], s['method']): s for s in summ if 'median' in s}
    for (shape, method), s in by.items():
        if not method.startswith('pwan'):
            continue
        cpd = by.get((shape, 'pycpd'))
        detail = f"{method.replace('pwan', 'PWAN', 1)} on {device}: MSE {s['median']:.4f}"
        if cpd is not None:
            detail += (
                f"; pycpd (CPU) {cpd['time_s']:.2f} s, MSE {cpd['median']:.4f}; "
                f"time ratio {s['time_s'] / max(cpd['time_s'], 1e-9):.1f}x"
            )
        if (shape, s['ratio'], method) in warm:
            detail += f"; first registration {warm[(shape, s['ratio'], method)]:.1f} s"
        rows.append(
            (f"non-rigid (a) {shape}, ratio {s['ratio']:g}", status('nonrigid'),
             round(s['time_s'], 2), detail)
        )
    return rows


def cpd_rows(protocol):
    def make():
        rows = []
        name = f'cpd-{protocol}'
        summ = json.load(open(os.path.join(res, f'bench_nonrigid_{protocol}_unrotated.json')))
        by = {(s['shape'], s['ratio'], s['method']): s for s in summ['summary'] if 'median' in s}
        for (shape, ratio, method), s in by.items():
            cpd = by.get((shape, ratio, 'pycpd'))
            if method != 'pwan' or cpd is None:
                continue
            cell = f'ratio {ratio:g}' if protocol == 'a' else f's = {ratio:g}'
            refused = ', refused' if s['refused'] else ''
            detail = (
                f"PWAN on {device}: MSE {s['median']:.2g}{refused}; pycpd (CPU) "
                f"{cpd['time_s']:.2f} s, MSE {cpd['median']:.2g}; "
                f"time ratio {s['time_s'] / max(cpd['time_s'], 1e-9):.1f}x"
            )
            rows.append((f'CPD\'s setting ({protocol}) {shape}, {cell}', status(name),
                         round(s['time_s'], 2), detail))
        return rows
    return make


rows = []
for name, make in (('tests', tests_rows), ('engine', engine_rows),
                   ('odometry', odometry_rows), ('nonrigid', nonrigid_rows),
                   ('cpd-a', cpd_rows('a')), ('cpd-b', cpd_rows('b'))):
    if name not in steps:  # not in --steps
        continue
    try:
        rows += make()
    except (OSError, ValueError, KeyError, StopIteration):
        rows.append((name, status(name), steps[name][1], 'no results'))
print(f'\n## device check on {device} (logs in {res})')
print('| check | status | wall s | result |')
print('|---|---|---|---|')
for r in rows:
    print('| ' + ' | '.join(str(c) for c in r) + ' |')
sys.exit(0 if all(rc == 0 for rc, _ in steps.values()) else 1)
EOF
