"""One module per kernel; the public names are re-exported by `samplers`."""

from .adjusted_mclmc import AdjustedMCLMC, AdjustedMCLMCState
from .ensemble_moves import DifferentialEvolution, Stretch
from .ghmc import GHMC, GHMCState
from .hmc import HMC
from .mala import MALA, GradientState
from .mclmc import MCLMC, MCLMCState
from .nuts import NUTS, NUTSInfo
from .random_walk import RandomWalk
from .sgmcmc import SGHMC, SGLD, SGHMCState, SGLDState

__all__ = [
    "GHMC",
    "HMC",
    "MALA",
    "MCLMC",
    "NUTS",
    "SGHMC",
    "SGLD",
    "AdjustedMCLMC",
    "AdjustedMCLMCState",
    "DifferentialEvolution",
    "GHMCState",
    "GradientState",
    "MCLMCState",
    "NUTSInfo",
    "RandomWalk",
    "SGHMCState",
    "SGLDState",
    "Stretch",
]
