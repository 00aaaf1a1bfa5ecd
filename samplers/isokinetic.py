"""Deprecated location: the isokinetic integrators moved to `samplers.integrators.isokinetic`.

This alias stays for one release.
"""

import warnings

from .integrators.isokinetic import *  # noqa: F403
from .integrators.isokinetic import __doc__ as _doc  # noqa: F401

warnings.warn(
    "samplers.isokinetic moved to samplers.integrators.isokinetic; the old name is an alias "
    "for one release.",
    DeprecationWarning,
    stacklevel=2,
)
