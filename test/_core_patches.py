"""The core internals that tests replace to build a failure deterministically (a stage forced to
return a wrong pose), named in one place: a rename in ``pwan_ros.core`` is a one-line change here.

Each name is a dotted attribute path for ``monkeypatch.setattr(NAME, value)``; :func:`original`
gives the attribute it names, for wrappers that call through."""

import importlib

#: the local fit as a non-rigid registration's pre-alignment calls it, ``fit(request, warn)`` ->
#: [(start score, RegistrationResult)], for the rigid pre-alignment and for the deformation
PREALIGN_FIT = 'pwan_ros.core.local.deform.fit'
#: the global search's candidate poses from feature matches (and, when those are weak, from
#: rotations)
FEATURE_HYPOTHESES = 'pwan_ros.core.global_search.search.feature_hypotheses'
ROTATION_HYPOTHESES = 'pwan_ros.core.global_search.search.rotation_hypotheses'
#: the global search's choice among its candidates -> GlobalOutcome (its verdict)
GLOBAL_CHOOSE = 'pwan_ros.core.global_search.search.choose'
#: the self-check's rival search (GICP from starts around a pose)
RIVAL_SEARCH = 'pwan_ros.core.checks.verify._rivals'


def original(name: str):
    """The attribute ``name`` (one of the constants above) names, as it is now."""
    module, attr = name.rsplit('.', 1)
    return getattr(importlib.import_module(module), attr)
