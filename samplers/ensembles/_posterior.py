"""SG-MCMC posteriors of a network's parameters: the minibatch log density and its draws."""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

import ensemblenn as enn
from ensemblenn import PER_CHAIN, DeepEnsemble

from ..driver import Result, run
from ..kernels import Sampler
from ._params import _num_data, _params


class MinibatchPosterior(eqx.Module):
    """The log posterior of a model's parameters as SGLD / SGHMC want it.

    `posterior(position, batch_indices)` is `log prior + num_data / batch_size * log
    likelihood of the batch`, an unbiased estimate of the full-data log posterior (up to
    a constant) at the flat parameter vector `position`. The model's floating-point arrays
    are raveled into `position` (in `jax.flatten_util.ravel_pytree` order); its other
    parts are kept, so `unflatten(position)` is a working model. The data are a broadcast
    field, so one replicated copy serves every chain and nothing is captured by closure.

    The prior is an isotropic Gaussian `N(0, prior_scale² I)` on every parameter;
    subclass and override `log_prior` for another.

    Args:
        model: a model whose parameter structure the positions follow (its values only
            serve as a template).
        data: pytree of arrays with a shared leading example axis.
        log_likelihood: `log_likelihood(model, batch)` -> the batch's log likelihoods,
            per example or already summed (they are summed).
        prior_scale: standard deviation of the Gaussian prior (a number, or one per
            parameter as a `(dim,)` array).

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx
        >>> from samplers.ensembles import MinibatchPosterior
        >>> x = jnp.linspace(-1, 1, 20)[:, None]
        >>> loglik = lambda m, b: -0.5 * jnp.sum((jax.vmap(m)(b[0]) - b[1]) ** 2)
        >>> model = eqx.nn.MLP(1, 1, 4, 1, key=jax.random.key(0))
        >>> posterior = MinibatchPosterior(model, (x, jnp.sin(x)), loglik)
        >>> posterior.dim, posterior.num_data
        (13, 20)
        >>> theta = posterior.flatten(model)
        >>> full = posterior(theta, jnp.arange(20))   # every example: the exact value
        >>> bool(jnp.allclose(full, posterior.log_prior(theta) + loglik(model, (x, jnp.sin(x)))))
        True
    """

    data: PyTree = enn.broadcast()
    skeleton: PyTree = enn.broadcast()  # the model minus its parameters
    log_likelihood: Callable[[PyTree, PyTree], Array] = eqx.field(static=True)
    prior_scale: float | Array
    # The parameter layout, as hashable statics rather than `ravel_pytree`'s closure: two
    # posteriors of same-shaped models then share every compiled program.
    treedef: Any = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    dtypes: tuple[np.dtype, ...] = eqx.field(static=True)
    num_data: int = eqx.field(static=True)

    def __init__(
        self,
        model: PyTree,
        data: PyTree,
        log_likelihood: Callable[[PyTree, PyTree], Array],
        *,
        prior_scale: float | ArrayLike = 1.0,
    ):
        params, self.skeleton = eqx.partition(model, eqx.is_inexact_array)
        leaves, self.treedef = jax.tree.flatten(params)
        self.shapes = tuple(tuple(np.shape(leaf)) for leaf in leaves)
        self.dtypes = tuple(np.dtype(leaf.dtype) for leaf in leaves)
        self.num_data = _num_data(data)
        self.data = data  # kept as given: no copy, never written to
        self.log_likelihood = log_likelihood
        self.prior_scale = prior_scale

    @property
    def dim(self) -> int:
        """Number of parameters (the length of a position)."""
        return sum(math.prod(shape) for shape in self.shapes)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of a position: the common dtype of the parameters."""
        return np.dtype(jnp.result_type(*self.dtypes)) if self.dtypes else np.dtype("float32")

    def flatten(self, model: PyTree) -> Float[Array, " dim"]:
        """ONE model's parameters as a flat position."""
        leaves, treedef = jax.tree.flatten(_params(model))
        if treedef != self.treedef or tuple(jnp.shape(x) for x in leaves) != self.shapes:
            raise enn.EnsembleError(
                f"flatten: the model's parameters ({[jnp.shape(x) for x in leaves]}) do not "
                f"match the posterior's ({list(self.shapes)}); pass ONE model (not a stacked "
                "ensemble) of the structure the posterior was built from."
            )
        return jnp.concatenate([jnp.ravel(x).astype(self.dtype) for x in leaves])

    def unflatten(self, position: Float[Array, " dim"]) -> PyTree:
        """The model whose parameters are `position` (ONE position)."""
        sizes = [math.prod(shape) for shape in self.shapes]
        pieces = jnp.split(position, np.cumsum(sizes)[:-1].tolist())
        leaves = [
            p.reshape(shape).astype(dtype)
            for p, shape, dtype in zip(pieces, self.shapes, self.dtypes)
        ]
        return eqx.combine(jax.tree.unflatten(self.treedef, leaves), self.skeleton)

    def log_prior(self, position: Float[Array, " dim"]) -> Float[Array, ""]:
        """Isotropic Gaussian log prior, up to a constant."""
        return -0.5 * jnp.sum((position / self.prior_scale) ** 2)

    def sample_prior(self, key: PRNGKeyArray) -> Float[Array, " dim"]:
        """A flat position drawn from the prior (a natural chain start)."""
        return self.prior_scale * jax.random.normal(key, (self.dim,), self.dtype)

    def __call__(
        self, position: Float[Array, " dim"], batch_indices: Int[ArrayLike, " batch"]
    ) -> Float[Array, ""]:
        """Unbiased minibatch estimate of the log posterior at `position`."""
        batch_indices = jnp.asarray(batch_indices)
        batch = jax.tree.map(lambda a: jnp.asarray(a)[batch_indices], self.data)
        loglik = jnp.sum(self.log_likelihood(self.unflatten(position), batch))
        return self.log_prior(position) + self.num_data / batch_indices.shape[0] * loglik


class PosteriorDraws(eqx.Module):
    """Sampled models: leaves stacked `(num_chains, num_draws, ...)`, per-chain.

    Attributes:
        model: the draws of every chain, as one model with two leading axes.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx
        >>> from samplers.ensembles import MinibatchPosterior, PosteriorDraws, predict
        >>> posterior = MinibatchPosterior(eqx.nn.Linear(2, 1, key=jax.random.key(0)),
        ...     (jnp.ones((6, 2)), jnp.ones((6, 1))), lambda m, b: 0.0)
        >>> draws = PosteriorDraws.from_positions(posterior, jnp.zeros((4, 3, posterior.dim)))
        >>> draws.num_chains, draws.num_draws, draws.model.weight.shape
        (4, 3, (4, 3, 1, 2))
        >>> predict(draws, jnp.ones((2, 2))).tolist()   # all-zero parameters predict 0
        [[0.0], [0.0]]
    """

    model: PyTree = enn.per_chain()

    @classmethod
    def from_positions(
        cls,
        posterior: "MinibatchPosterior",
        positions: Float[ArrayLike, "chains draws dim"] | Float[ArrayLike, "chains dim"],
        *,
        mesh: Any = None,
        axis: str = "chains",
    ) -> "PosteriorDraws":
        """Unflatten flat positions (e.g. `Result.trace`, or prior draws) into models.

        `(num_chains, dim)` positions count as one draw per chain.

        Example:
            >>> import jax, jax.numpy as jnp, equinox as eqx, ensemblenn as enn
            >>> from samplers.ensembles import MinibatchPosterior, PosteriorDraws
            >>> posterior = MinibatchPosterior(eqx.nn.Linear(2, 1, key=jax.random.key(0)),
            ...     (jnp.ones((6, 2)), jnp.ones((6, 1))), lambda m, b: 0.0)
            >>> prior = jax.vmap(posterior.sample_prior)(enn.chain_keys(jax.random.key(1), 4))
            >>> PosteriorDraws.from_positions(posterior, prior).model.weight.shape
            (4, 1, 1, 2)
        """
        if np.ndim(positions) == 2:
            positions = jnp.asarray(positions)[:, None]
        if np.ndim(positions) != 3 or np.shape(positions)[-1] != posterior.dim:
            raise enn.EnsembleError(
                f"positions must have shape (num_chains, num_draws, {posterior.dim}) or "
                f"(num_chains, {posterior.dim}), got {np.shape(positions)}."
            )
        unflatten = enn.ensemble_map(
            _unflatten_chain, in_roles=(None, PER_CHAIN), mesh=mesh, axis=axis
        )
        return unflatten(posterior, positions)

    @property
    def num_chains(self) -> int:
        return int(jax.tree.leaves(eqx.filter(self.model, eqx.is_array))[0].shape[0])

    @property
    def num_draws(self) -> int:
        return int(jax.tree.leaves(eqx.filter(self.model, eqx.is_array))[0].shape[1])


def _flatten_member(posterior: MinibatchPosterior, model: PyTree) -> Array:
    return posterior.flatten(model)


def _unflatten_chain(posterior: MinibatchPosterior, draws: Array) -> PosteriorDraws:
    return PosteriorDraws(eqx.filter_vmap(posterior.unflatten)(draws))


def sample_posterior(
    sampler: Sampler,
    posterior: MinibatchPosterior,
    start: Float[ArrayLike, "chains dim"] | DeepEnsemble | PyTree,
    *,
    key: PRNGKeyArray,
    num_steps: int,
    num_warmup: int = 0,
    thin: int = 1,
    mesh: Any = None,
    axis: str = "chains",
    **run_kwargs: Any,
) -> tuple[PosteriorDraws, Result]:
    """Run an SG-MCMC ensemble on a model's posterior and return the draws as models.

    A thin wrapper: `start` is flattened to `(num_chains, dim)` positions, `samplers.run`
    does the sampling (the step count, and so any optax schedule of it, continues across
    its chunks), and the thinned trace is unflattened into models.

    Args:
        sampler: usually `samplers.SGLD` or `samplers.SGHMC` with `num_data =
            posterior.num_data`; any sampler whose logdensity protocol matches works.
        posterior: the `MinibatchPosterior`.
        start: flat positions `(num_chains, dim)`, a `DeepEnsemble` (e.g. trained members)
            or a model with a leading chain axis.
        key, num_steps, num_warmup: as for `samplers.run`.
        thin: keep every `thin`-th sampling step.
        mesh, axis, run_kwargs: passed to `samplers.run`.

    Returns:
        `(draws, result)`: `PosteriorDraws` with `num_steps // thin` draws per chain, and
        the `samplers.Result` (final states, diagnostics over the flat parameters).

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, ensemblenn as enn, samplers
        >>> from samplers import ensembles
        >>> x = jnp.linspace(-1, 1, 20)[:, None]
        >>> loglik = lambda m, b: -0.5 * jnp.sum((jax.vmap(m)(b[0]) - b[1]) ** 2)
        >>> posterior = ensembles.MinibatchPosterior(
        ...     eqx.nn.MLP(1, 1, 4, 1, key=jax.random.key(0)), (x, jnp.sin(x)), loglik)
        >>> start = jax.vmap(posterior.sample_prior)(enn.chain_keys(jax.random.key(1), 4))
        >>> sgld = samplers.SGLD(step_size=1e-3, batch_size=5, num_data=20)
        >>> draws, result = ensembles.sample_posterior(sgld, posterior, start,
        ...     key=jax.random.key(2), num_steps=20, thin=5, progress=False)
        >>> draws.num_chains, draws.num_draws, draws.model.layers[0].weight.shape
        (4, 4, (4, 4, 4, 1))
    """
    if not isinstance(posterior, MinibatchPosterior):
        raise enn.EnsembleError(
            f"posterior must be a MinibatchPosterior, got {type(posterior).__name__}."
        )
    common = dict(mesh=mesh, axis=axis)
    if isinstance(start, DeepEnsemble):
        start = start.model
    if not (eqx.is_array_like(start) and np.ndim(start) == 2):
        start = enn.ensemble_map(_flatten_member, in_roles=(None, PER_CHAIN), **common)(
            posterior, start
        )
    result = run(
        sampler,
        posterior,
        start,
        key=key,
        num_steps=num_steps,
        num_warmup=num_warmup,
        thin=thin,
        **common,
        **run_kwargs,
    )
    return PosteriorDraws.from_positions(posterior, result.trace, **common), result
