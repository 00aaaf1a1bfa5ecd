"""Gradients to a b² threshold: how many gradients per chain the ensemble needs before its
per-step b² stays below a threshold (how the LAPS paper reports its results)."""

import math

import numpy as np
from jaxtyping import ArrayLike


def grads_to_threshold(b2: ArrayLike, grads: ArrayLike, threshold: float) -> float:
    """The cumulative gradients per chain at the first step after which every later `b2`
    is below `threshold`; `inf` if the last step is not below it.

    Args:
        b2: the ensemble's b² after each step, `(steps,)`.
        grads: the gradients per chain spent up to and including each step, `(steps,)`.
        threshold: the b² level.

    Example:
        >>> grads_to_threshold([0.5, 0.005, 0.02, 0.009, 0.001], [10, 20, 30, 40, 50], 0.01)
        40.0
        >>> grads_to_threshold([0.5, 0.02], [10, 20], 0.01)
        inf
    """
    b2, grads = np.asarray(b2, np.float64), np.asarray(grads, np.float64)
    above = ~(b2 < threshold)  # NaN counts as above
    if b2.size == 0 or above[-1]:
        return math.inf
    last_above = np.flatnonzero(above)
    first = int(last_above[-1]) + 1 if last_above.size else 0
    return float(grads[first])
