"""The ensemble average of predictions, for trained members or posterior draws."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PyTree

import ensemblenn as enn
from ensemblenn import DeepEnsemble

from ._posterior import PosteriorDraws

ApplyFn = Callable[[PyTree, Array], Array]
"""`apply(model, x) -> predictions` for a batch of inputs `x`."""


def predict(
    models: DeepEnsemble | PosteriorDraws | PyTree,
    x: Float[ArrayLike, "batch ..."],
    *,
    apply: ApplyFn | None = None,
    mesh: Any = None,
    axis: str = "chains",
) -> PyTree:
    """The ensemble-mean prediction at inputs `x` (a posterior predictive mean): draws of
    an SG-MCMC posterior averaged over chains and draws, or `enn.predict` for a deep
    ensemble.

    Args:
        models: `PosteriorDraws`, a `enn.DeepEnsemble`, or a model whose arrays carry a
            leading member axis.
        x: a batch of inputs, broadcast to every member.
        apply: `apply(model, x) -> predictions` for one model; default
            `jax.vmap(model)(x)` (equinox layers act on one example).
        mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
        axis: the mesh axis the chains are sharded over.

    Returns:
        The mean over chains (and draws) of `apply(model, x)`, replicated.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax, ensemblenn as enn
        >>> from samplers import ensembles
        >>> ens = enn.init_ensemble(lambda k: eqx.nn.Linear(1, 1, key=k),
        ...                         optax.sgd(0.1), jax.random.key(0), 4)
        >>> x = jnp.ones((3, 1))
        >>> bool(jnp.allclose(ensembles.predict(ens, x), enn.predict(ens, x)))
        True
    """
    if not isinstance(models, PosteriorDraws):
        return enn.predict(models, x, apply=apply, mesh=mesh, axis=axis)
    one = apply or (lambda model, x: jax.vmap(model)(x))

    def per_chain(draws: PyTree, x: Array) -> PyTree:
        # This chain's draws averaged first: every chain has as many, so the mean over
        # chains of these means is the mean over all draws.
        per_draw = eqx.filter_vmap(lambda m: one(m, x))(draws)
        return jax.tree.map(lambda p: jnp.mean(p, axis=0), per_draw)

    return enn.predict(models.model, x, apply=per_chain, mesh=mesh, axis=axis)
