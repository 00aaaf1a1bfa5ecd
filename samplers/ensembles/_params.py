"""What the ensemble code reads off a model and a data set."""

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PyTree

import ensemblenn as enn


def _params(model: PyTree) -> PyTree:
    """The trainable part of a model: its floating-point arrays."""
    return eqx.filter(model, eqx.is_inexact_array)


def _num_data(data: PyTree) -> int:
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(data)}
    if len(sizes) != 1 or None in sizes:
        raise enn.EnsembleError(
            "data must be a pytree of arrays sharing a leading (example) axis, got leading "
            f"sizes {sorted(map(str, sizes))}."
        )
    return int(next(iter(sizes)))
