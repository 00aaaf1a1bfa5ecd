"""One module per kernel; the public names are re-exported by `samplers`."""

from .ghmc import GHMC, GHMCState
from .hmc import HMC
from .mala import MALA, GradientState
from .random_walk import RandomWalk

__all__ = ["GHMC", "HMC", "MALA", "GHMCState", "GradientState", "RandomWalk"]
