"""``pwan_odometry_node`` on a machine where a full-PWAN recovery takes a while: every recovery
starts ``PWAN_TEST_RECOVERY_DELAY_S`` seconds late (default 2), then runs for real. For the test
that scans keep being answered while one runs (the node's own code, one delay added)."""

import os
import sys
import time

from pwan_ros.odometry import pipeline
from pwan_ros.ros.odometry_node import main

_real = pipeline.recover


def _late(aligner, *args):
    end = time.monotonic() + float(os.environ.get('PWAN_TEST_RECOVERY_DELAY_S', '2'))
    while time.monotonic() < end:
        aligner.raise_if_cancelled()  # shutdown still stops it
        time.sleep(0.01)
    return _real(aligner, *args)


pipeline.recover = _late

if __name__ == '__main__':
    sys.exit(main())
