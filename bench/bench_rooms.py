"""Global registration of low-overlap indoor views, with and without the sensors' viewpoints.

Two depth-camera fragments of a simulated room (``pwan_ros.evaluation.room_sim``: Open3D ray
casting, each fragment in its camera frame) from two places, for nine yaw pairs; every pair is
registered with ``init='global'`` from no initial pose, once on geometry alone and once with
``viewpoints='origin'`` (the free-space test). Per run: 'correct' (status ok, < 2 deg and
< 10 cm), 'refused', or 'WRONG' (status ok but off: the worst outcome). ``overlap`` is the true
fraction of b's points within 5 cm of a's.

    python bench/bench_rooms.py --rooms furnished box
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from scipy.spatial import cKDTree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table, write_results  # noqa: E402

from pwan_ros.core import RegistrationConfig, register  # noqa: E402
from pwan_ros.evaluation.room_sim import ROOMS, view_pair  # noqa: E402
from pwan_ros.geometry.se3 import invert, rotation_angle  # noqa: E402

#: camera positions (m) per room; the box room's are point-symmetric about its centre, so a half
#: turn of the room maps one camera onto the other (its hardest case)
POSITIONS = {
    'furnished': ((-1.5, -0.5, 1.4), (1.5, 0.8, 1.4)),
    'box': ((-1.0, -0.5, 1.4), (1.0, 0.5, 1.4)),
}
YAWS = (
    (0, 90),
    (30, 150),
    (-30, 120),
    (-60, 45),
    (90, 180),
    (180, 0),
    (-120, 60),
    (150, -90),
    (0, 100),
)


def verdict(res, gt) -> str:
    err = invert(gt) @ res.transform
    if res.status != 'ok':
        return 'refused'
    return (
        'correct'
        if np.degrees(rotation_angle(err)) < 2.0 and np.linalg.norm(err[:3, 3]) < 0.1
        else 'WRONG'
    )


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('--rooms', nargs='+', default=list(ROOMS), choices=ROOMS)
    p.add_argument('--results', default='results/rooms')
    args = p.parse_args(argv)
    rows, summary = [], []
    for kind in args.rooms:
        pa, pb = POSITIONS[kind]
        counts = {}
        for ya, yb in YAWS:
            a, b, gt = view_pair(kind, (pa, ya), (pb, yb))
            row = {
                'room': kind,
                'yaws': f'{ya}/{yb}',
                'overlap': float(
                    (cKDTree(a).query(b @ gt[:3, :3].T + gt[:3, 3])[0] < 0.05).mean()
                ),
            }
            for label, views in (('geometry', None), ('viewpoints', 'origin')):
                t0 = time.perf_counter()
                res = register(b, a, RegistrationConfig(), init='global', viewpoints=views)
                row[label] = verdict(res, gt)
                row[label + '_s'] = time.perf_counter() - t0
                counts[(label, row[label])] = counts.get((label, row[label]), 0) + 1
            rows.append(row)
            print(row, flush=True)
        for label in ('geometry', 'viewpoints'):
            summary.append(
                {
                    'room': kind,
                    'input': label,
                    **{v: counts.get((label, v), 0) for v in ('correct', 'refused', 'WRONG')},
                    'mean_s': float(np.mean([r[label + '_s'] for r in rows if r['room'] == kind])),
                }
            )
    print_table(
        rows,
        ['room', 'yaws', 'overlap', 'geometry', 'viewpoints', 'geometry_s', 'viewpoints_s'],
        'Global registration of two room views, per pair',
    )
    print_table(
        summary,
        ['room', 'input', 'correct', 'refused', 'WRONG', 'mean_s'],
        f'Global registration of two room views ({len(YAWS)} pairs per room)',
    )
    write_results(args.results, 'bench_rooms', rows, summary)


if __name__ == '__main__':
    main()
