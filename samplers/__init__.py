"""samplers: MCMC kernels as equinox modules, run sharded over many devices by ensemblenn.

Example:
    >>> import jax, jax.numpy as jnp, samplers
    >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
    >>> result = samplers.run(samplers.MALA(step_size=0.3), target,
    ...                       jnp.zeros((8, 4)), key=jax.random.key(0), num_steps=50,
    ...                       progress=False)
    >>> result.state.position.shape
    (8, 4)
"""

from . import adaptation, arviz, checkpoint, diagnostics, distributed, ensembles, integrators
from . import isokinetic, targets
from ._adaptation import Adaptation
from ._compilation_cache import default_cache_dir, enable_compilation_cache
from ._moments import ChainMoments
from ._result import Diagnostics, Result
from ._run import run
from ._sampler import (
    Hyper,
    Info,
    Logdensity,
    Sampler,
    State,
    metropolis,
    resolve,
    select,
    unadjusted_info,
)
from .adaptation import LAPS, MEADS, AdaptationInfo, ChEES, EnsembleAdaptation
from .checkpoint import CheckpointError, CheckpointMismatchError
from .kernels import (
    GHMC,
    HMC,
    MALA,
    MCLMC,
    SGHMC,
    SGLD,
    AdjustedMCLMC,
    AdjustedMCLMCState,
    DifferentialEvolution,
    GHMCState,
    GradientState,
    MCLMCState,
    RandomWalk,
    SGHMCState,
    SGLDState,
    Stretch,
)

__all__ = [
    # the driver and its result
    "run",
    "enable_compilation_cache",
    "default_cache_dir",
    "Result",
    "Diagnostics",
    "ChainMoments",
    # writing kernels
    "Sampler",
    "State",
    "Info",
    "Hyper",
    "Logdensity",
    "resolve",
    "metropolis",
    "select",
    "unadjusted_info",
    # kernels
    "RandomWalk",
    "MALA",
    "HMC",
    "GHMC",
    "MCLMC",
    "AdjustedMCLMC",
    "SGLD",
    "SGHMC",
    "Stretch",
    "DifferentialEvolution",
    "GradientState",
    "GHMCState",
    "MCLMCState",
    "AdjustedMCLMCState",
    "SGLDState",
    "SGHMCState",
    # ensemble adaptation
    "Adaptation",
    "EnsembleAdaptation",
    "AdaptationInfo",
    "LAPS",
    "ChEES",
    "MEADS",
    # reliability
    "CheckpointError",
    "CheckpointMismatchError",
    # submodules
    "adaptation",
    "arviz",
    "checkpoint",
    "diagnostics",
    "distributed",
    "ensembles",
    "integrators",
    "isokinetic",
    "targets",
]
