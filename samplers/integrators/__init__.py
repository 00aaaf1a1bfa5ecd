"""Integrators of Hamiltonian dynamics, below the kernels: the leapfrog integrator with the
Gaussian kinetic energy (HMC, GHMC, NUTS, ChEES) and the isokinetic integrators of the
microcanonical kernels (MCLMC, AdjustedMCLMC, LAPS).

Example:
    >>> import jax.numpy as jnp
    >>> from samplers.integrators import kinetic_energy
    >>> float(kinetic_energy(jnp.array([1.0, 2.0]), 1.0))
    2.5
"""

from . import isokinetic
from ._leapfrog import (
    InverseMassMatrix,
    LogdensityAndGrad,
    kinetic_energy,
    leapfrog,
    sample_momentum,
    value_and_grad,
    velocity,
)

__all__ = [
    "isokinetic",
    "kinetic_energy",
    "leapfrog",
    "sample_momentum",
    "value_and_grad",
    "velocity",
]
