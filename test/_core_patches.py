"""The core internals that tests replace to build a failure deterministically (a stage forced to
return a wrong pose), named in one place: a rename in ``pwan_ros.core`` is a one-line change here.

Each name is a dotted attribute path for ``monkeypatch.setattr(NAME, value)``; :func:`original`
gives the attribute it names, for wrappers that call through."""

import importlib

#: the rigid registration(s) that pre-align a non-rigid one (``api.register`` calls it by this
#: name, for the pre-alignment and for the deformation)
REGISTER_CANDIDATES = 'pwan_ros.core.api.register_candidates'
#: the initial rotations of the multi-start, identity first (as ``candidates`` imported it)
START_ROTATIONS = 'pwan_ros.core.candidates.start_rotations'
#: Alg. 1 over a group of starts, as the multi-start's stages call it
MULTISTART_ALG1 = 'pwan_ros.core.multistart.run_alg1'
#: the starts' own poses (rotation + voted translation) kept as tournament candidates
OWN_POSES = 'pwan_ros.core.multistart.own_poses'
#: the global search's candidate poses from feature matches (and, when those are weak, from
#: rotations)
FEATURE_HYPOTHESES = 'pwan_ros.core.global_search.feature_hypotheses'
ROTATION_HYPOTHESES = 'pwan_ros.core.global_search.rotation_hypotheses'


def original(name: str):
    """The attribute ``name`` (one of the constants above) names, as it is now."""
    module, attr = name.rsplit('.', 1)
    return getattr(importlib.import_module(module), attr)
