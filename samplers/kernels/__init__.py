"""One module per kernel, and the machinery they share.

`_base` holds the abstract `Sampler` with its `State` and `Info`; `_transition` the pieces
every transition shares (Metropolis-Hastings, divergence rule, finiteness, the
gradient-carrying state); `_blocks` how the driver runs one chain's `init`/`step` inside
the ensemble. Kernels import from those, never from one another.
"""

from ._base import Hyper, Info, Logdensity, Sampler, State, hyperparameter, resolve
from ._blocks import init_chain, step_chain
from ._transition import (
    DIVERGENCE_THRESHOLD,
    GradientState,
    Trajectory,
    all_finite,
    hamiltonian_proposal,
    is_divergent,
    log_density,
    metropolis,
    metropolis_info,
    next_count,
    select,
    unadjusted_info,
)
from .adjusted_mclmc import AdjustedMCLMC, AdjustedMCLMCState
from .ensemble_moves import DifferentialEvolution, Stretch
from .ghmc import GHMC, GHMCState
from .hmc import HMC
from .mala import MALA
from .mclmc import MCLMC, MCLMCState
from .nuts import NUTS, NUTSInfo
from .random_walk import RandomWalk
from .sgmcmc import SGHMC, SGLD, SGHMCState, SGLDState

__all__ = [
    "DIVERGENCE_THRESHOLD",
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
    "Hyper",
    "Info",
    "Logdensity",
    "MCLMCState",
    "NUTSInfo",
    "RandomWalk",
    "SGHMCState",
    "SGLDState",
    "Sampler",
    "State",
    "Stretch",
    "Trajectory",
    "all_finite",
    "hamiltonian_proposal",
    "hyperparameter",
    "init_chain",
    "is_divergent",
    "log_density",
    "metropolis",
    "metropolis_info",
    "next_count",
    "resolve",
    "select",
    "step_chain",
    "unadjusted_info",
]
