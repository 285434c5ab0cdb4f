"""Feature sets read from ``.npz`` files, validated and streamed in batches.

Labelled file: ``features`` (N, D) numeric, ``labels`` (N,) int (0-based), optional
``class_names`` (K,) str. Unlabelled file: ``features`` (M, D), optional ``labels`` (M,) used
only for evaluation. A ``features`` array stored uncompressed (``np.savez``) is memory-mapped
in place; a compressed one (``np.savez_compressed``) larger than ``max_memory_mb`` is inflated
in chunks to a temporary file and memory-mapped, so sets larger than RAM never load at once.
"""

from __future__ import annotations

import os
import struct
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence

import numpy as np

from .errors import AdaptInputError

_LOCAL_HEADER = struct.Struct('<4s2B4HL2L2H')  # zip local file header (30 bytes)
CHUNK_ROWS = 8192


@dataclass
class FeatureSet:
    """Rows of features (N, D), optional labels (N,) int64 and class names.

    ``features`` may be a ``np.memmap``; use :meth:`rows` / :meth:`batches`, which return
    float32 copies, instead of touching it directly."""

    features: np.ndarray
    labels: Optional[np.ndarray] = None
    class_names: Optional[List[str]] = None
    path: str = ''
    _tmpfile: Optional[str] = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` (k,) as float32 (k, D)."""
        return np.asarray(self.features[np.asarray(index)], dtype=np.float32)

    def batches(self, size: int) -> Iterator[np.ndarray]:
        """Consecutive float32 blocks of at most ``size`` rows covering all rows in order."""
        for s in range(0, self.n, size):
            yield np.asarray(self.features[s : s + size], dtype=np.float32)

    def close(self) -> None:
        """Release the memory map and delete a temporary inflated copy, if any."""
        feats = self.features
        self.features = np.zeros((0, self.dim), np.float32)
        if isinstance(feats, np.memmap) and feats._mmap is not None:
            feats._mmap.close()
        del feats
        if self._tmpfile and os.path.exists(self._tmpfile):
            os.unlink(self._tmpfile)
        self._tmpfile = None


def _member(zf: zipfile.ZipFile, name: str, path: str, role: str) -> zipfile.ZipInfo:
    try:
        return zf.getinfo(name + '.npy')
    except KeyError:
        have = ', '.join(sorted(n[:-4] for n in zf.namelist() if n.endswith('.npy'))) or 'nothing'
        raise AdaptInputError(f"{role} file {path}: no '{name}' array (it has: {have})") from None


def _read_npy_header(fh):
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    except (ValueError, OSError) as exc:
        raise AdaptInputError(f'not a valid .npy member: {exc}') from exc
    return shape, fortran, dtype


def _open_features(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, role: str, max_memory_mb: float
) -> tuple:
    """Return (array, tmpfile) for the ``features`` member, memory-mapped when large."""
    with zf.open(info) as fh:
        shape, fortran, dtype = _read_npy_header(fh)
        header_len = fh.tell()
    if dtype.hasobject:
        raise AdaptInputError(f'{role} file {path}: features have dtype object; expected numbers')
    if not (
        np.issubdtype(dtype, np.floating)
        or np.issubdtype(dtype, np.integer)
        or np.issubdtype(dtype, np.bool_)
    ):
        raise AdaptInputError(f'{role} file {path}: features have dtype {dtype}; expected numbers')
    if len(shape) != 2:
        raise AdaptInputError(
            f'{role} file {path}: features must be 2-D (N, D), got shape {shape}'
        )
    if shape[0] == 0 or shape[1] == 0:
        raise AdaptInputError(f'{role} file {path}: features are empty (shape {shape})')
    order = 'F' if fortran else 'C'
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes <= max_memory_mb * 2**20:
        return _read_member(zf, 'features', path, role), None
    if info.compress_type == zipfile.ZIP_STORED:
        with open(path, 'rb') as raw:
            raw.seek(info.header_offset)
            head = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
            data_start = info.header_offset + _LOCAL_HEADER.size + head[-2] + head[-1]
        arr = np.memmap(
            path,
            dtype=dtype,
            mode='r',
            offset=data_start + header_len,
            shape=tuple(shape),
            order=order,
        )
        return arr, None
    # Compressed and large: inflate in chunks to a temporary .npy and memory-map it.
    fd, tmp = tempfile.mkstemp(prefix='pwan_adapt_', suffix='.npy')
    try:
        with os.fdopen(fd, 'wb') as out, zf.open(info) as fh:
            fh.seek(0)
            while True:
                buf = fh.read(64 * 2**20)
                if not buf:
                    break
                out.write(buf)
        arr = np.load(tmp, mmap_mode='r')
    except BaseException:
        os.unlink(tmp)
        raise
    return arr, tmp


#: the features are used as float32: a finite float64 beyond this becomes inf there (a 1e300
#: gave a NaN model, deployed as 'adapted' at 21 % accuracy)
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_finite(features: np.ndarray, path: str, role: str) -> None:
    if not np.issubdtype(features.dtype, np.floating):
        return
    wide = features.dtype.itemsize > 4
    for s in range(0, features.shape[0], CHUNK_ROWS):
        block = np.asarray(features[s : s + CHUNK_ROWS])
        bad = ~np.isfinite(block)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise AdaptInputError(
                f'{role} file {path}: features contain NaN or infinite values '
                f'(first at row {s + int(r)}, column {int(c)})'
            )
        if wide and (np.abs(block) > FLOAT32_MAX).any():
            r, c = np.argwhere(np.abs(block) > FLOAT32_MAX)[0]
            raise AdaptInputError(
                f'{role} file {path}: feature {float(block[r, c]):g} at row {s + int(r)}, '
                f'column {int(c)} is beyond the float32 range the model computes in'
            )


def _read_member(zf: zipfile.ZipFile, name: str, path: str, role: str) -> np.ndarray:
    """Member ``name`` read whole, never unpickled: an object array is an AdaptInputError."""
    with zf.open(name + '.npy') as fh:
        try:
            return np.lib.format.read_array(fh, allow_pickle=False)
        except ValueError as exc:
            raise AdaptInputError(f'{role} file {path}: {name} unreadable: {exc}') from exc


def _labels(zf: zipfile.ZipFile, n: int, path: str, role: str) -> Optional[np.ndarray]:
    if 'labels.npy' not in zf.namelist():
        return None
    lab = _read_member(zf, 'labels', path, role)
    lab = np.squeeze(lab) if lab.ndim == 2 and 1 in lab.shape else lab
    if lab.ndim != 1 or lab.shape[0] != n:
        raise AdaptInputError(
            f'{role} file {path}: labels must have shape ({n},) to match the '
            f'features, got {tuple(lab.shape)}'
        )
    if np.issubdtype(lab.dtype, np.floating):
        if not np.all(np.isfinite(lab)) or np.any(lab != np.round(lab)):
            raise AdaptInputError(
                f'{role} file {path}: labels must be integers (0-based class ids)'
            )
    elif not np.issubdtype(lab.dtype, np.integer):
        raise AdaptInputError(
            f'{role} file {path}: labels must be integers, got dtype {lab.dtype}'
        )
    return lab.astype(np.int64)


def load_npz(
    path, role: str = 'labelled', require_labels: bool = False, max_memory_mb: float = 1024.0
) -> FeatureSet:
    """Read and validate one ``.npz`` file (see module docstring). ``role`` names it in errors."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise AdaptInputError(f'{role} file {path} is a directory, expected a .npz file')
    if not os.path.exists(path):
        raise AdaptInputError(f'{role} file {path} does not exist')
    if not os.path.isfile(path):
        raise AdaptInputError(f'{role} file {path} is not a regular file, expected a .npz file')
    if os.path.getsize(path) == 0:
        raise AdaptInputError(f'{role} file {path} is empty')
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise AdaptInputError(f'{role} file {path} is not a readable .npz archive: {exc}') from exc
    with zf:
        info = _member(zf, 'features', path, role)
        features, tmp = _open_features(zf, info, path, role, max_memory_mb)
        try:
            _check_finite(features, path, role)
            labels = _labels(zf, features.shape[0], path, role)
            if require_labels and labels is None:
                raise AdaptInputError(f"{role} file {path}: no 'labels' array (required)")
            names = None
            if 'class_names.npy' in zf.namelist():
                raw = _read_member(zf, 'class_names', path, role)
                names = [str(x) for x in np.atleast_1d(raw).tolist()]
        except BaseException:
            if tmp:
                os.unlink(tmp)
            raise
    return FeatureSet(features, labels, names, path, tmp)


def check_pair(labelled: FeatureSet, unlabelled: FeatureSet) -> int:
    """Validate a labelled/unlabelled pair; return the number of classes K.

    K = len(class_names) when given, else max(label) + 1. Every class must have labelled rows."""
    if labelled.labels is None:
        raise AdaptInputError(f"labelled file {labelled.path}: no 'labels' array")
    if labelled.dim != unlabelled.dim:
        raise AdaptInputError(
            f'feature dimensions differ: labelled {labelled.path} has D={labelled.dim}, '
            f'unlabelled {unlabelled.path} has D={unlabelled.dim}'
        )
    lab = labelled.labels
    if lab.min() < 0:
        raise AdaptInputError(
            f'labelled file {labelled.path}: negative label {int(lab.min())} '
            '(labels are 0-based class ids)'
        )
    k = len(labelled.class_names) if labelled.class_names is not None else int(lab.max()) + 1
    if k < 2:
        raise AdaptInputError(f'labelled file {labelled.path}: need at least 2 classes, got {k}')
    if lab.max() >= k:
        raise AdaptInputError(
            f'labelled file {labelled.path}: label {int(lab.max())} out of range for '
            f'{k} class_names'
        )
    if k > lab.size:  # before counting: a stray label 2**40 would allocate 8 TB
        raise AdaptInputError(
            f'labelled file {labelled.path}: label {int(lab.max())} makes {k} classes, more '
            f'than its {lab.size} rows (labels are 0-based class ids)'
        )
    counts = np.bincount(lab, minlength=k)
    if (counts == 0).any():
        missing = np.flatnonzero(counts == 0)
        listed = str(missing[:10].tolist())[:-1] + (', ...]' if missing.size > 10 else ']')
        hint = ' (labels 1-based? they are 0-based class ids)' if missing.tolist() == [0] else ''
        raise AdaptInputError(
            f'labelled file {labelled.path}: {missing.size} class(es) {listed} have no rows; '
            f'every class 0..{k - 1} needs labelled examples{hint}'
        )
    _same_class_ids(labelled, unlabelled)
    if unlabelled.labels is not None:
        ul = unlabelled.labels
        if ul.min() < 0 or ul.max() >= k:
            bad = int(ul.min()) if ul.min() < 0 else int(ul.max())
            raise AdaptInputError(
                f'unlabelled file {unlabelled.path}: evaluation label {bad} out of range '
                f'0..{k - 1}'
            )
    return k


def _same_class_ids(labelled: FeatureSet, unlabelled: FeatureSet) -> None:
    """Give the unlabelled file's evaluation labels the labelled file's class ids when its own
    ``class_names`` differ (an import of a bag that holds part of the classes numbers them 0..;
    its accuracy read 0.0 against a true 0.835); refuse names the labelled file lacks or names
    it cannot compare."""
    names, theirs = labelled.class_names, unlabelled.class_names
    if theirs is None or theirs == names:
        return
    if names is None:
        raise AdaptInputError(
            f'unlabelled file {unlabelled.path} names its classes, the labelled file '
            f'{labelled.path} does not: give both class_names (the same ids must name the same '
            'classes)'
        )
    unknown = [c for c in theirs if c not in names]
    if unknown:
        raise AdaptInputError(
            f'unlabelled file {unlabelled.path}: class_names {unknown[:5]} are not among the '
            f'labelled file\'s {names[:10]}'
        )
    if unlabelled.labels is not None:
        ids = np.array([names.index(c) for c in theirs])
        if unlabelled.labels.min() < 0 or unlabelled.labels.max() >= len(ids):
            raise AdaptInputError(
                f'unlabelled file {unlabelled.path}: a label is out of range for its '
                f'{len(ids)} class_names'
            )
        unlabelled.labels = ids[unlabelled.labels]
    unlabelled.class_names = list(names)


def save_npz(
    path,
    features: np.ndarray,
    labels: Optional[np.ndarray] = None,
    class_names: Optional[Sequence[str]] = None,
    compressed: bool = False,
) -> None:
    """Write a feature file in the format :func:`load_npz` reads, atomically."""
    from pwan_ros.io.atomic import atomic_path

    arrays = {'features': np.asarray(features, dtype=np.float32)}
    if labels is not None:
        arrays['labels'] = np.asarray(labels, dtype=np.int64)
    if class_names is not None:
        arrays['class_names'] = np.asarray([str(c) for c in class_names])
    with atomic_path(path) as tmp:
        with open(tmp, 'wb') as fh:
            (np.savez_compressed if compressed else np.savez)(fh, **arrays)
