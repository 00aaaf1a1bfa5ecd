"""A value with one entry per chain, for places whose role is otherwise broadcast."""

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array

from ._errors import EnsembleError, EnsembleTypeError
from ._roles import per_chain


class PerChainValue(eqx.Module):
    """Wraps an array whose leading axis is the ensemble axis.

    Useful where a field is broadcast by default, e.g. a sampler hyperparameter: the
    innermost declared role wins, so the wrapped array is sharded per chain and each
    chain's function sees its own entry as `.value`.

    Raises:
        EnsembleTypeError: a leaf of `value` is not numeric (e.g. a str).
        EnsembleError: a leaf of `value` is a scalar (it needs a leading chain axis).

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> step_sizes = enn.PerChainValue(jnp.arange(1.0, 9.0))
        >>> f = enn.ensemble_map(lambda s, x: x * s.value, in_roles=(None, enn.PER_CHAIN))
        >>> f(step_sizes, jnp.full(8, 0.5)).tolist()
        [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    """

    value: Array = per_chain()

    def __check_init__(self) -> None:
        # Concrete leaves only: inside a transform each chain's entry is a traced scalar.
        for path, leaf in jax.tree_util.tree_leaves_with_path(self.value):
            if isinstance(leaf, jax.core.Tracer):
                continue
            where = f"PerChainValue.value{jax.tree_util.keystr(path)}"
            dtype = getattr(leaf, "dtype", None)
            if dtype is None and not isinstance(leaf, str | bytes):
                dtype = np.asarray(leaf).dtype
            if dtype is None or not (
                jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) or np.dtype(dtype).kind in "biufc"
            ):
                raise EnsembleTypeError(
                    f"{where} must be an array with one entry per chain, got {leaf!r} "
                    f"({type(leaf).__name__}).\n  fix: enn.PerChainValue(jnp.array([...])) "
                    "with num_chains entries."
                )
            if np.ndim(leaf) == 0:
                raise EnsembleError(
                    f"{where} is a scalar ({leaf!r}); it needs a leading axis of one entry per "
                    "chain.\n  fix: enn.PerChainValue(jnp.full(num_chains, value)), or pass "
                    "the plain number to share it between chains."
                )
