"""Errors of the adaptation package: every bad input ends in one of these, with a clear message."""


class AdaptError(Exception):
    """Base class of adaptation errors."""


class AdaptConfigError(AdaptError, ValueError):
    """An invalid configuration value or file."""


class AdaptInputError(AdaptError, ValueError):
    """Invalid input data (shapes, NaNs, labels, empty files, unreadable files)."""


class AdaptOutputError(AdaptError):
    """An output that cannot be written (not a directory, read-only, full disk): ``path:
    reason``."""
