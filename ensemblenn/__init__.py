"""ensemblenn: run large ensembles sharded across devices, with nothing captured by closure.

Example:
    >>> import jax, jax.numpy as jnp, ensemblenn as enn
    >>> step = enn.ensemble_map(lambda x: x - enn.chain_mean(x), in_roles=enn.PER_CHAIN)
    >>> step(jnp.arange(4.0)).tolist()
    [-1.5, -0.5, 0.5, 1.5]

Several processes: `enn.distributed` places process-local chains and typed keys as global
arrays, and `enn.chain_keys(key, n, mesh=mesh)` gives the keys laid out over the mesh.
"""

from . import distributed
from ._batch_invariant import batch_invariant
from ._chain_take import chain_take
from ._closures import shard_map_captures
from ._collectives import (
    chain_all_gather,
    chain_index,
    chain_mean,
    chain_sum,
    device_all_gather,
    device_index,
    num_chains,
    num_devices,
    ordered_sum,
    rounded,
)
from ._ensemble_map import EnsembleMapped, ensemble_map
from ._exact_division import exact_divisions
from ._errors import (
    ChainCountError,
    ClosureError,
    CollectiveError,
    EnsembleError,
    EnsembleTypeError,
    MeshError,
    OutputRoleError,
    RoleError,
)
from ._mesh import default_mesh, mesh_platform, resolve_mesh
from ._partition import combine, partition
from ._per_chain_value import PerChainValue
from ._random import chain_keys
from ._roles import BROADCAST, PER_CHAIN, Role, broadcast, per_chain, role_of
from ._weak_type import weakly_typed

# --- deep ensembles: members trained by their own optimizers (uses the names above) ---
from ._deep_ensemble import DeepEnsemble, fit, init_ensemble, predict, train_step

__all__ = [
    "BROADCAST",
    "DeepEnsemble",
    "fit",
    "init_ensemble",
    "predict",
    "train_step",
    "PER_CHAIN",
    "ChainCountError",
    "ClosureError",
    "CollectiveError",
    "EnsembleError",
    "EnsembleTypeError",
    "EnsembleMapped",
    "MeshError",
    "OutputRoleError",
    "PerChainValue",
    "Role",
    "RoleError",
    "batch_invariant",
    "broadcast",
    "chain_all_gather",
    "chain_index",
    "chain_keys",
    "chain_take",
    "chain_mean",
    "chain_sum",
    "combine",
    "default_mesh",
    "device_all_gather",
    "device_index",
    "distributed",
    "ensemble_map",
    "exact_divisions",
    "num_chains",
    "num_devices",
    "ordered_sum",
    "partition",
    "per_chain",
    "mesh_platform",
    "resolve_mesh",
    "role_of",
    "rounded",
    "shard_map_captures",
    "weakly_typed",
]

__version__ = "0.1.0"

# Errors show their public names in tracebacks and on the docs pages (`ensemblenn.RoleError`,
# not the private module that defines them).
for _error in (ChainCountError, ClosureError, CollectiveError, EnsembleError, EnsembleTypeError,
               MeshError, OutputRoleError, RoleError):  # fmt: skip
    _error.__module__ = __name__
del _error
