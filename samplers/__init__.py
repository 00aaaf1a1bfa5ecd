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

from ._sampler import Hyper, Info, Logdensity, Sampler, State, metropolis, resolve, select
from ._sampler import unadjusted_info

# --- kernels: gradient-based (RandomWalk, MALA, HMC, GHMC) ---
from .kernels import GHMC, HMC, MALA, GHMCState, GradientState, RandomWalk
# --- kernels: MCLMC family and SG-MCMC ---
from . import isokinetic
from .kernels import SGHMC, SGLD, AdjustedMCLMC, AdjustedMCLMCState, MCLMC, MCLMCState
from .kernels import SGHMCState, SGLDState
# --- ensemble moves (Stretch, DifferentialEvolution) ---
from .kernels import DifferentialEvolution, Stretch
# --- diagnostics and targets ---
from . import diagnostics, targets
# --- driver ---
from ._adaptation import Adaptation
from ._moments import Moments
from ._result import Diagnostics, Result
from ._run import run
# --- adaptation ---
from . import adaptation
from .adaptation import AdaptationInfo, EnsembleAdaptation
from .adaptation import ChEES, MEADS
from .adaptation import LAPS
# --- reliability: checkpoints, multi-process, arviz ---
from . import arviz, checkpoint, distributed
from .checkpoint import CheckpointError, CheckpointMismatchError
from . import ensembles
