"""The ensemble average of predictions, for trained members or posterior draws."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PyTree

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from ._posterior import PosteriorDraws
from ._training import DeepEnsemble

ApplyFn = Callable[[PyTree, Array], Array]
"""`apply(model, x) -> predictions` for a batch of inputs `x`."""


def _apply_per_example(model: PyTree, x: Array) -> Array:
    # equinox layers act on one example; a batch is a vmap.
    return jax.vmap(model)(x)


def _predict_member(model: PyTree, x: Array, apply: ApplyFn, has_draws: bool) -> Any:
    if has_draws:
        # Average this chain's draws first: every chain has as many, so the chain mean of
        # chain means is the mean over all draws.
        per_draw = eqx.filter_vmap(lambda m: apply(m, x))(model)
        mean = jax.tree.map(lambda p: jnp.mean(p, axis=0), per_draw)
    else:
        mean = apply(model, x)
    return enn.chain_mean(mean)


def predict(
    models: DeepEnsemble | PosteriorDraws | PyTree,
    x: Float[ArrayLike, "batch ..."],
    *,
    apply: ApplyFn | None = None,
    mesh: Any = None,
    axis: str = "chains",
) -> PyTree:
    """The ensemble-mean prediction at inputs `x` (a posterior predictive mean).

    Args:
        models: a `DeepEnsemble`, `PosteriorDraws` (averaged over chains and draws), or a
            model whose arrays carry a leading member axis.
        x: a batch of inputs, broadcast to every member.
        apply: `apply(model, x) -> predictions` for one model; default
            `jax.vmap(model)(x)` (equinox layers act on one example).
        mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
        axis: the mesh axis the members are sharded over.

    Returns:
        The mean over members (and draws) of `apply(model, x)`, replicated.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax
        >>> from samplers import ensembles
        >>> ens = ensembles.init_ensemble(lambda k: eqx.nn.Linear(1, 1, key=k),
        ...                               optax.sgd(0.1), jax.random.key(0), 4)
        >>> x = jnp.ones((3, 1))
        >>> manual = (ens.model.weight[:, 0, 0] + ens.model.bias[:, 0]).mean()
        >>> bool(jnp.allclose(ensembles.predict(ens, x), manual))
        True
    """
    has_draws = isinstance(models, PosteriorDraws)
    if isinstance(models, (DeepEnsemble, PosteriorDraws)):
        models = models.model
    mapped = enn.ensemble_map(
        _predict_member,
        in_roles=(PER_CHAIN, BROADCAST, None, None),
        out_roles=BROADCAST,
        mesh=mesh,
        axis=axis,
    )
    return mapped(models, x, apply or _apply_per_example, has_draws)
