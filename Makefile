# pwan_ros developer commands. The two a new user needs: `make demo` and `make test`.
# Every target first creates/refreshes the project virtualenv (.venv) with tools/setup_env.sh;
# that step is idempotent and takes a second or two once everything is installed.
#
# Variables: VENV (default .venv), PYTHON (interpreter for a new venv), TORCH_SPEC (default
# torch==2.13.0, the CPU build; TORCH_SPEC=torch for CUDA), ROS_WHEEL_DISTRO (default jazzy),
# PYTEST_ARGS (extra pytest arguments), TEST_WORKERS (pytest-xdist workers of `make test`, default
# 2; 0 runs in one process), DATA (the shared evaluation data, default ../shared/data).

VENV ?= .venv
PY := $(VENV)/bin/python
RUFF := $(VENV)/bin/ruff
DATA ?= ../shared/data
RESULTS ?= results
PYTEST_ARGS ?=
# `make test` on pytest-xdist workers: each test file runs whole on one worker, in order (its
# module fixtures built once), but for the three largest, whose tests are handed out one by one;
# the files whose tools pick their own DDS domains run first, on one worker together
# (test/conftest.py). Each worker's ROS tests use their own DDS domains.
TEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile,)
# Wheel-installed ROS lives in the venv prefix; ament_index needs it named. A sourced system
# ROS already sets AMENT_PREFIX_PATH.
export AMENT_PREFIX_PATH ?= $(abspath $(VENV))

.PHONY: setup setup-bench test test-unit test-slow test-all lint format demo bench clean-venv help

help:
	@echo "make demo       run the main job on data the package makes itself"
	@echo "make test       set up .venv, check the style (ruff) and run the fast test suite"
	@echo "make test-unit  the fast loop: style check, then no DDS processes, no colcon, no slow"
	@echo "                or heavy tests"
	@echo "make lint       only the style check: ruff check + ruff format --check (ruff.toml)"
	@echo "make format     apply the house style: ruff check --fix, then ruff format"
	@echo "make test-slow  run the slow tests (real data in $(DATA), large inputs)"
	@echo "make bench      run the benchmarks on $(DATA), results in $(RESULTS)/"

setup:
	@bash tools/setup_env.sh

setup-bench:
	@EXTRAS=test,bench bash tools/setup_env.sh

# The main job on data the package makes itself: simulate a LiDAR bag (once, cached), replay it
# into pwan_odometry_node over DDS, evaluate the trajectory against ground truth.
demo: setup
	$(PY) -m pwan_ros.cli.demo --output $(RESULTS)/demo

# `test` and `test-unit` check the house style (ruff.toml: lint + formatting) before any test runs;
# `make format` fixes what can be fixed automatically.
test: setup
	$(RUFF) check .
	$(RUFF) format --check .
	$(PY) -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# The edit-test loop: no DDS processes, no colcon build, no slow or seconds-long (heavy) tests.
test-unit: setup
	$(RUFF) check .
	$(RUFF) format --check .
	$(PY) -m pytest -m "not slow and not ros and not build and not heavy" $(PYTEST_ARGS)

test-slow: setup
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(RUFF) check .
	$(RUFF) format --check .

# Fixes first (an import removed can leave lines to reformat), then the formatter.
format: setup
	$(RUFF) check --fix .
	$(RUFF) format .

clean-venv:
	rm -rf $(VENV)

# Benchmarks on the shared evaluation data, side by side with other libraries (long: about an
# hour on 2 cores). Each script prints its tables and writes JSON under $(RESULTS)/.
bench: setup-bench
	$(PY) bench/bench_lidar.py --data $(DATA) --results $(RESULTS)/lidar
	$(PY) bench/bench_speed.py --data $(DATA) --results $(RESULTS)/speed
	$(PY) bench/bench_rigid.py --data $(DATA) --results $(RESULTS)/rigid --outliers 0 0.5 1.0
	$(PY) bench/bench_nonrigid.py --data $(DATA) --results $(RESULTS)/nonrigid --protocol a
	$(PY) bench/bench_deskew.py --results $(RESULTS)/deskew
	$(PY) bench/bench_drift.py --data $(DATA) --results $(RESULTS)/drift
	$(PY) bench/bench_pda.py --data $(DATA)/pda --features googlenet --methods logreg kmm dreweight mlp pwan --out $(RESULTS)/pda_googlenet.json
