"""Meshes in and out: pwan_register reads a PLY / OBJ mesh (its vertices are the points) and writes
the moved mesh with its faces."""

import json

import numpy as np
import pytest
from scipy.spatial import ConvexHull

from _core_shapes import knobbed_blob, rot3
from pwan_ros.cli.register import main
from pwan_ros.io.point_files import read_mesh
from pwan_ros.io.point_files import read_points, write_points

R = rot3(8, -5, 12)
T = np.array([120.0, -35.5, 2.0])  # metres, far from the origin


def _blob_mesh(n=400, seed=1):
    """Points of the knobbed blob with the triangles of their convex hull (every point a vertex,
    some in no face: the order of the vertices is what the faces refer to)."""
    pts = knobbed_blob(n, seed)
    return pts, ConvexHull(pts).simplices.astype(np.int64)


@pytest.mark.parametrize('src_ext,out_ext', [('.ply', '.obj'), ('.obj', '.ply')])
def test_a_mesh_source_comes_back_moved_with_its_faces(tmp_path, capsys, src_ext, out_ext):
    pts, tris = _blob_mesh()
    sp, rp, op = tmp_path / f'src{src_ext}', tmp_path / 'ref.npy', tmp_path / f'out{out_ext}'
    write_points(str(sp), pts, triangles=tris)
    np.save(rp, knobbed_blob(400, 0) @ R.T + T)
    rc = main([str(sp), str(rp), '--json', '-q', '--output', str(op), '--steps', '150'])
    assert rc == 0
    tf = np.array(json.loads(capsys.readouterr().out)['transform'])
    out = read_mesh(str(op))
    np.testing.assert_array_equal(out.triangles, tris)
    np.testing.assert_allclose(out.vertices, pts @ tf[:3, :3].T + tf[:3, 3], atol=1e-9)
    assert np.abs(tf[:3, 3] - T).max() < 0.02


def test_obj_reader_fans_polygons_and_reads_every_token_form(tmp_path):
    """Normals, texture coordinates, vertex colours, negative (relative) indices, a quad, a vertex
    no face uses, 17-digit map coordinates: all as an exporter writes them."""
    text = (
        '# exporter\nmtllib body.mtl\no body\n'
        'v 512345.67812345678 4498765.4321 1.5 0.2 0.3 0.4\nv 1 0 0\nv 0 1 0\nv 0 0 1\nv 9 9 9\n'
        'vt 0.5 0.5\nvn 0 0 1\nvn 1 0 0\nusemtl skin\n'
        'f 1/1/1 2/1/1 3/1/1\nf -4//2 -3//2 -2//2 -1//2\n'
    )
    path = tmp_path / 'body.obj'
    path.write_text(text)
    mesh = read_mesh(str(path))
    assert mesh.vertices[0].tolist() == [512345.67812345678, 4498765.4321, 1.5]
    assert len(mesh.vertices) == 5  # the unused vertex is kept: indices stay the file's
    np.testing.assert_array_equal(mesh.triangles, [[0, 1, 2], [1, 2, 3], [1, 3, 4]])
    np.testing.assert_array_equal(read_points(str(path)), mesh.vertices)


def test_faces_touching_a_non_finite_vertex_are_left_out(tmp_path):
    pts, tris = _blob_mesh(60)
    pts[5] = np.nan
    for ext in ('.ply', '.obj'):
        path = str(tmp_path / f'm{ext}')
        write_points(path, pts, triangles=tris)
        mesh = read_mesh(path)
        np.testing.assert_array_equal(mesh.vertices, pts)  # NaN row kept: input order
        np.testing.assert_array_equal(mesh.triangles, tris[~(tris == 5).any(axis=1)])


@pytest.mark.parametrize(
    'text,msg',
    [
        ('v 0 0 0\nv 1 0 0\nf 1 2 3\n', 'a face refers to a vertex the file does not have'),
        ('v 0 0\n', 'a vertex needs x y z'),
        ('v 0 zero 0\n', 'bad vertex'),
        ('# only a comment\n', 'no vertices in OBJ file'),
        ('v 0 0 0\nf 1 x 1\n', 'bad face index'),
    ],
)
def test_a_broken_obj_is_one_line_and_exit_2(tmp_path, capsys, text, msg):
    bad = tmp_path / 'bad.obj'
    bad.write_text(text)
    ref = tmp_path / 'ref.npy'
    np.save(ref, knobbed_blob(100, 0))
    assert main([str(bad), str(ref), '-q']) == 2
    err = capsys.readouterr().err
    assert msg in err and 'Traceback' not in err and len(err.strip().splitlines()) == 1
