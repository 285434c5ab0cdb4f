"""The fine-tune's bounded nearest-neighbour query on real pairs: small_gicp's k-d tree (no bound:
the nearest of every row, then masked), scipy's bounded k-d tree search, and
:class:`pwan_ros.core.nearest.HostNearest`, which picks one of the two per query, side by side on
the same rows in one process.

Per set (the first pair of each of bench_verify's sets, metres): the source at the reference
transform (most rows near the reference) and at identity (a pose a local search from no prior
leaves: most rows far), all its points and a random 2000, queried within 2 median reference
spacings (the distance-type fine-tune's h, ``finetune.overlap_refine``). Median of 5 repeats, one
thread; ratio = HostNearest / small_gicp.

    python bench/bench_nearest.py [--data ../shared/data] [--sets bunny balm nuscenes indoor]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_verify import load_pairs  # noqa: E402
from common import print_table, write_results  # noqa: E402

from pwan_ros.core.nearest import HostNearest  # noqa: E402

REPEATS = 5


def _ms(fn) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def measure(kind: str, name: str, src, ref, gt) -> list:
    """Rows of one pair: each pose x row count."""
    search = HostNearest(ref)
    bound = 2.0 * search.spacing
    rng = np.random.default_rng(0)
    rows = []
    for label, pose in (('reference transform', gt), ('identity', np.eye(4))):
        moved = src @ pose[:3, :3].T + pose[:3, 3]
        for count in (2000, len(moved)):
            z = np.ascontiguousarray(moved[rng.choice(len(moved), min(count, len(moved)), False)])
            d_tree, _ = search.tree.query(z, k=1, distance_upper_bound=bound)
            d_host, _ = search.query(z, distance_upper_bound=bound)
            assert np.array_equal(np.isinf(d_tree), np.isinf(d_host))  # the same rows found
            fast = _ms(lambda z=z: search._fast.batch_nearest_neighbor_search(z, num_threads=1))
            tree = _ms(lambda z=z: search.tree.query(z, k=1, distance_upper_bound=bound))
            host = _ms(lambda z=z: search.query(z, distance_upper_bound=bound))
            rows.append(
                {
                    'set': kind,
                    'pair': name,
                    'pose': label,
                    'rows': len(z),
                    'within_bound': float(np.mean(np.isfinite(d_host))),
                    'small_gicp_ms': fast,
                    'bounded_kdtree_ms': tree,
                    'HostNearest_ms': host,
                    'ratio': host / fast,
                }
            )
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument('--data', default='../shared/data')
    ap.add_argument('--results', default='results/nearest')
    ap.add_argument('--sets', nargs='+', default=['bunny', 'balm', 'nuscenes', 'indoor'])
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    rows, seen = [], set()
    for kind, name, src, ref, gt in load_pairs(args.data, args.sets):
        if kind not in seen:
            seen.add(kind)
            rows += measure(kind, name, src, ref, gt)
    print_table(
        rows,
        list(rows[0]),
        'Bounded nearest-neighbour queries (2 spacings), ms, one thread',
    )
    write_results(args.results, 'bench_nearest', rows, [])
    return 0


if __name__ == '__main__':
    sys.exit(main())
