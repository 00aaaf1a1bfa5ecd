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

from . import adaptation, arviz, checkpoint, diagnostics, ensembles, integrators
from . import random, smc, targets, welford
from ._compilation_cache import default_cache_dir, enable_compilation_cache
from ._errors import PrecisionWarning, SamplerError, SamplerTypeError
from .adaptation import (
    LAPS,
    MEADS,
    Adaptation,
    AdaptationInfo,
    ChEES,
    EnsembleAdaptation,
    MCLMCTuning,
    WindowAdaptation,
    WindowAdaptationInfo,
)
from .checkpoint import CheckpointError, CheckpointMismatchError
from .driver import (
    ChainMoments,
    ConvergenceWarning,
    Diagnostics,
    PositionsError,
    Result,
    Unconstrained,
    Verdict,
    run,
)
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
    Hyper,
    Info,
    Logdensity,
    MCLMCState,
    NUTS,
    NUTSInfo,
    RandomWalk,
    Sampler,
    SGHMCState,
    SGLDState,
    State,
    Stretch,
    hyperparameter,
    metropolis,
    resolve,
    select,
    unadjusted_info,
)
from .smc import SMC, SMCResult


__all__ = [
    # the driver and its result
    "run",
    "enable_compilation_cache",
    "default_cache_dir",
    "Result",
    "Diagnostics",
    "ChainMoments",
    "Verdict",
    "ConvergenceWarning",
    "PrecisionWarning",
    # writing kernels
    "Sampler",
    "State",
    "Info",
    "Hyper",
    "Logdensity",
    "hyperparameter",
    "resolve",
    "metropolis",
    "select",
    "unadjusted_info",
    # kernels
    "RandomWalk",
    "MALA",
    "HMC",
    "GHMC",
    "NUTS",
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
    "NUTSInfo",
    # ensemble adaptation
    "Adaptation",
    "EnsembleAdaptation",
    "AdaptationInfo",
    "LAPS",
    "ChEES",
    "MEADS",
    "MCLMCTuning",
    "WindowAdaptation",
    "WindowAdaptationInfo",
    # sequential Monte Carlo
    "SMC",
    "SMCResult",
    # reliability
    "SamplerError",
    "SamplerTypeError",
    "CheckpointError",
    "CheckpointMismatchError",
    "PositionsError",
    "Unconstrained",
    # submodules
    "adaptation",
    "arviz",
    "checkpoint",
    "diagnostics",
    "ensembles",
    "integrators",
    "random",
    "smc",
    "targets",
    "welford",
]
