"""One module per kernel; the public names are re-exported by `samplers`."""

from .adjusted_mclmc import AdjustedMCLMC as AdjustedMCLMC
from .adjusted_mclmc import AdjustedMCLMCState as AdjustedMCLMCState
from .ensemble_moves import DifferentialEvolution, Stretch
from .ghmc import GHMC, GHMCState
from .hmc import HMC
from .mala import MALA, GradientState
from .mclmc import MCLMC as MCLMC
from .mclmc import MCLMCState as MCLMCState
from .random_walk import RandomWalk
from .sgmcmc import SGHMC as SGHMC
from .sgmcmc import SGLD as SGLD
from .sgmcmc import SGHMCState as SGHMCState
from .sgmcmc import SGLDState as SGLDState

__all__ = ["GHMC", "HMC", "MALA", "GHMCState", "GradientState", "RandomWalk"]
