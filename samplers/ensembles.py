"""Deep ensembles and SG-MCMC for neural networks, sharded over devices.

Two ways to get an ensemble of networks, both written for ONE member and run across the
ensemble by `enn.ensemble_map`:

* **Deep ensembles**: `init_ensemble` builds `num_members` equinox models from per-member
  keys, each with its own optax optimizer state (`DeepEnsemble`, both fields per-chain);
  `train_step` is one optimizer step of one member and `fit` runs many steps of every member
  in one compiled loop. The data are broadcast: one replicated copy serves every member.
* **SG-MCMC**: `MinibatchPosterior` turns a model, a log-likelihood and broadcast data into
  the `logdensity(flat_params, batch_indices)` that `samplers.SGLD` / `samplers.SGHMC`
  expect (`log prior + N / B * minibatch log-likelihood`); `sample_posterior` runs them with
  `samplers.run` and hands back the draws as models (`PosteriorDraws`).

`predict` averages the predictions of either kind of ensemble.

Example:
    >>> import jax, jax.numpy as jnp, equinox as eqx, optax, samplers
    >>> from samplers import ensembles
    >>> x = jnp.linspace(-1.0, 1.0, 32)[:, None]
    >>> data = (x, jnp.sin(3 * x))
    >>> make = lambda key: eqx.nn.MLP(1, 1, 8, 1, activation=jax.nn.tanh, key=key)
    >>> mse = lambda model, batch: jnp.mean((jax.vmap(model)(batch[0]) - batch[1]) ** 2)
    >>> optimizer = optax.adam(1e-2)
    >>> ensemble = ensembles.init_ensemble(make, optimizer, jax.random.key(0), 4)
    >>> ensemble, losses = ensembles.fit(ensemble, data, optimizer, mse, num_steps=50)
    >>> losses.shape, bool((losses[:, -1] < losses[:, 0]).all())
    ((4, 50), True)
    >>> ensembles.predict(ensemble, x).shape
    (32, 1)
"""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from ._result import Result
from ._run import run
from ._sampler import Sampler

__all__ = [
    "DeepEnsemble",
    "MinibatchPosterior",
    "PosteriorDraws",
    "fit",
    "init_ensemble",
    "predict",
    "sample_posterior",
    "train_step",
]

LossFn = Callable[[PyTree, PyTree], Float[Array, ""]]
"""`loss_fn(model, batch) -> scalar loss` for one model (vmap over examples yourself)."""
ApplyFn = Callable[[PyTree, Array], Array]
"""`apply(model, x) -> predictions` for a batch of inputs `x`."""


def _apply_per_example(model: PyTree, x: Array) -> Array:
    # equinox layers act on one example; a batch is a vmap.
    return jax.vmap(model)(x)


class DeepEnsemble(eqx.Module):
    """Models and optimizer states of a deep ensemble, one row per member.

    Both fields are per-chain: every array leaf has a leading member axis, sharded over
    the mesh. Inside a function run by `ensemble_map` the same class holds ONE member
    (leaves without that axis), which is what `train_step` takes and returns. Non-array
    parts of the model (activation functions, sizes) stay static.

    Attributes:
        model: the equinox models, leaves stacked `(num_members, ...)`.
        opt_state: each member's optax state, leaves stacked `(num_members, ...)`.

    Example:
        >>> import jax, equinox as eqx, optax, ensemblenn as enn
        >>> from samplers import ensembles
        >>> ens = ensembles.init_ensemble(lambda k: eqx.nn.Linear(2, 1, key=k),
        ...                               optax.sgd(0.1), jax.random.key(0), 4)
        >>> isinstance(ens, ensembles.DeepEnsemble), ens.num_members, ens.model.weight.shape
        (True, 4, (4, 1, 2))
        >>> enn.role_of(ens, "model"), enn.role_of(ens, "opt_state")
        (enn.PER_CHAIN, enn.PER_CHAIN)
    """

    model: PyTree = enn.per_chain()
    opt_state: optax.OptState = enn.per_chain()

    @property
    def num_members(self) -> int:
        """The ensemble size (the leading axis of the model's arrays)."""
        return int(jax.tree.leaves(eqx.filter(self.model, eqx.is_array))[0].shape[0])


def _params(model: PyTree) -> PyTree:
    """The trainable part of a model: its floating-point arrays."""
    return eqx.filter(model, eqx.is_inexact_array)


def _is_inject_state(node: Any) -> bool:
    return isinstance(node, optax.InjectStatefulHyperparamsState)


def _set_hyperparams(opt_state: optax.OptState, values: dict[str, Any]) -> optax.OptState:
    """`opt_state` with the numeric hyperparameters in `values` replaced, for one member.

    Raises:
        enn.EnsembleError: a name is not a numeric hyperparameter of an
            `optax.inject_hyperparams` state (a scheduled one would be overwritten at the
            next update, so setting it is refused rather than silently lost).
    """
    holders = [
        s for s in jax.tree.leaves(opt_state, is_leaf=_is_inject_state) if _is_inject_state(s)
    ]
    for name in values:
        if not any(name in s.hyperparams and name not in s.hyperparams_states for s in holders):
            found = sorted({k for s in holders for k in s.hyperparams})
            raise enn.EnsembleError(
                f"hyperparams[{name!r}]: the optimizer state has no numeric hyperparameter "
                f"{name!r} (its injectable hyperparameters: {found or 'none'}).\n  fix: build "
                f"the optimizer with optax.inject_hyperparams, giving {name!r} a number, e.g. "
                f"optax.inject_hyperparams(optax.adam)({name}=1e-3)."
            )

    def replace(node: Any) -> Any:
        if not _is_inject_state(node):
            return node
        new = dict(node.hyperparams)  # never touch the dict optax handed out
        for name, value in values.items():
            if name in new and name not in node.hyperparams_states:
                new[name] = jnp.asarray(value, new[name].dtype)
        return node._replace(hyperparams=new)

    return jax.tree.map(replace, opt_state, is_leaf=_is_inject_state)


def _init_member(
    make_model: Callable[[PRNGKeyArray], PyTree],
    optimizer: optax.GradientTransformation,
    key: PRNGKeyArray,
    hyperparams: dict[str, Any],
) -> DeepEnsemble:
    model = make_model(key)
    opt_state = optimizer.init(_params(model))
    if hyperparams:
        values = {
            k: v.value if isinstance(v, enn.PerChainValue) else v for k, v in hyperparams.items()
        }
        opt_state = _set_hyperparams(opt_state, values)
    return DeepEnsemble(model, opt_state)


def init_ensemble(
    make_model: Callable[[PRNGKeyArray], PyTree],
    optimizer: optax.GradientTransformation,
    key: PRNGKeyArray,
    num_members: int,
    *,
    hyperparams: dict[str, float | ArrayLike | enn.PerChainValue] | None = None,
    mesh: Any = None,
    axis: str = "chains",
) -> DeepEnsemble:
    """`num_members` models, each from its own key, each with its own optimizer state.

    Member `i` is `make_model(enn.chain_keys(key, num_members)[i])`, so it is the same
    model whatever the device count or ensemble size. The optimizer (one static
    `optax.GradientTransformation` shared by all) is initialised on the model's
    floating-point arrays.

    Args:
        make_model: `key -> model` for ONE member, e.g. `lambda k: eqx.nn.MLP(..., key=k)`.
        optimizer: the optax optimizer every member uses.
        key: the ensemble's PRNG key.
        num_members: ensemble size; a multiple of the number of devices on `axis`.
        hyperparams: per-member optimizer hyperparameters, `{name: value}`, where a value
            is a number (all members) or an `enn.PerChainValue` with one entry per member.
            The optimizer must come from `optax.inject_hyperparams` with `name` given as
            a number (not a schedule).
        mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
        axis: the mesh axis the members are sharded over.

    Returns:
        A `DeepEnsemble` whose leaves are stacked `(num_members, ...)` and sharded.

    Raises:
        enn.EnsembleError: a hyperparameter the optimizer state does not hold, or
            per-member values of the wrong length (`enn.ChainCountError`).

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax, ensemblenn as enn
        >>> from samplers import ensembles
        >>> make = lambda key: eqx.nn.MLP(1, 1, 8, 1, key=key)
        >>> opt = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
        >>> ens = ensembles.init_ensemble(make, opt, jax.random.key(0), 4,
        ...     hyperparams={"learning_rate": enn.PerChainValue(jnp.array([0., .1, .2, .3]))})
        >>> ens.num_members, ens.model.layers[0].weight.shape
        (4, (4, 8, 1))
        >>> [round(lr, 2) for lr in ens.opt_state.hyperparams["learning_rate"].tolist()]
        [0.0, 0.1, 0.2, 0.3]
    """
    if isinstance(num_members, bool) or not isinstance(num_members, (int, np.integer)):
        raise enn.EnsembleError(f"num_members must be an int, got {num_members!r}.")
    keys = enn.chain_keys(key, int(num_members))
    init = enn.ensemble_map(
        _init_member, in_roles=(None, None, PER_CHAIN, None), mesh=mesh, axis=axis
    )
    return init(make_model, optimizer, keys, dict(hyperparams or {}))


def train_step(
    member: DeepEnsemble,
    batch: PyTree,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
) -> tuple[DeepEnsemble, Float[Array, ""]]:
    """One optimizer step of ONE member; run it over the ensemble with `enn.ensemble_map`.

    Only the model's floating-point arrays are differentiated and updated; everything
    else (activation functions, integer buffers) passes through unchanged.

    Args:
        member: one member (`DeepEnsemble` leaves without the member axis).
        batch: the data for this step, as `loss_fn` wants it (broadcast to all members).
        optimizer: the optax optimizer the state was made with.
        loss_fn: `loss_fn(model, batch) -> scalar`.

    Returns:
        `(member, loss)`: the updated member and the loss before the update.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax, ensemblenn as enn
        >>> from samplers import ensembles
        >>> opt = optax.sgd(0.1)
        >>> ens = ensembles.init_ensemble(lambda k: eqx.nn.Linear(2, 1, key=k), opt,
        ...                               jax.random.key(0), 8)
        >>> loss = lambda m, b: jnp.mean((jax.vmap(m)(b[0]) - b[1]) ** 2)
        >>> step = enn.ensemble_map(ensembles.train_step)
        >>> ens, losses = step(ens, (jnp.ones((5, 2)), jnp.zeros((5, 1))), opt, loss)
        >>> losses.shape
        (8,)
    """
    params, rest = eqx.partition(member.model, eqx.is_inexact_array)
    loss, grads = jax.value_and_grad(lambda p: loss_fn(eqx.combine(p, rest), batch))(params)
    updates, opt_state = optimizer.update(grads, member.opt_state, params)
    return DeepEnsemble(eqx.apply_updates(member.model, updates), opt_state), loss


def _num_data(data: PyTree) -> int:
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(data)}
    if len(sizes) != 1 or None in sizes:
        raise enn.EnsembleError(
            "data must be a pytree of arrays sharing a leading (example) axis, got leading "
            f"sizes {sorted(map(str, sizes))}."
        )
    return int(next(iter(sizes)))


def _fit_member(
    member: DeepEnsemble,
    data: PyTree,
    key: PRNGKeyArray | None,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
    num_steps: int,
    batch_size: int | None,
    num_data: int,
) -> tuple[DeepEnsemble, Array]:
    # The scan carry must be arrays only; activation functions etc. ride along statically.
    arrays, static = eqx.partition(member, eqx.is_array)

    def one(arrays: DeepEnsemble, t: Array) -> tuple[DeepEnsemble, Array]:
        member = eqx.combine(arrays, static)
        batch = data
        if batch_size is not None:
            # Each member draws its own batches (from its own key): a different data order
            # per member is part of what makes the members differ.
            idx = jax.random.choice(
                jax.random.fold_in(key, t), num_data, (batch_size,), replace=False
            )
            batch = jax.tree.map(lambda a: a[idx], data)
        # In blocks of members (the ensemble_map's block_size): the same bits on any
        # number of devices.
        member, loss = enn.batch_invariant(train_step)(member, batch, optimizer, loss_fn)
        return eqx.filter(member, eqx.is_array), loss

    arrays, losses = jax.lax.scan(one, arrays, jnp.arange(num_steps))
    return eqx.combine(arrays, static), losses


def fit(
    ensemble: DeepEnsemble,
    data: PyTree,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
    *,
    num_steps: int,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    mesh: Any = None,
    axis: str = "chains",
    block_size: int | str | None = "auto",
) -> tuple[DeepEnsemble, Float[Array, "members steps"]]:
    """Train every member for `num_steps` optimizer steps, in one compiled `lax.scan`.

    Args:
        ensemble: from `init_ensemble` (or a previous `fit`); it is not modified.
        data: pytree of arrays with a shared leading example axis, broadcast to members.
        optimizer: the optimizer `ensemble.opt_state` was made with.
        loss_fn: `loss_fn(model, batch) -> scalar` for one model.
        num_steps: optimizer steps per member.
        batch_size: if given, each step uses `batch_size` examples drawn without
            replacement; each member draws its own (from `key`). None: full batch.
        key: the PRNG key for minibatches (required with `batch_size`).
        mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
        axis: the mesh axis the members are sharded over.
        block_size: members per compiled block of each training step (see
            `enn.ensemble_map`). With the default `"auto"`, SGD training (momentum
            included) gives the same bits on any number of devices; with `optax.adam` we
            still measure last-bit differences between device counts (not yet explained).
            `None` trains a device's members in one batch.

    Returns:
        `(ensemble, losses)`: the trained ensemble and each member's loss before each
        step, shape `(num_members, num_steps)`.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax
        >>> from samplers import ensembles
        >>> x = jnp.linspace(-1, 1, 16)[:, None]
        >>> opt = optax.adam(1e-2)
        >>> ens = ensembles.init_ensemble(lambda k: eqx.nn.MLP(1, 1, 4, 1, key=k), opt,
        ...                               jax.random.key(0), 4)
        >>> loss = lambda m, b: jnp.mean((jax.vmap(m)(b[0]) - b[1]) ** 2)
        >>> ens, losses = ensembles.fit(ens, (x, 2 * x), opt, loss, num_steps=20,
        ...                             batch_size=8, key=jax.random.key(1))
        >>> losses.shape
        (4, 20)
    """
    if not isinstance(ensemble, DeepEnsemble):
        raise enn.EnsembleError(
            f"fit expects a DeepEnsemble (from init_ensemble), got {type(ensemble).__name__}."
        )
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise enn.EnsembleError(f"num_steps must be an int >= 1, got {num_steps!r}.")
    num_data = _num_data(data)
    keys = None
    if batch_size is not None:
        if not 1 <= batch_size <= num_data:
            raise enn.EnsembleError(
                f"batch_size must be in [1, {num_data}] (the number of examples), got "
                f"{batch_size!r}."
            )
        if key is None:
            raise enn.EnsembleError("fit: minibatches (batch_size=...) need a key=.")
        keys = enn.chain_keys(key, ensemble.num_members)
    step = enn.ensemble_map(
        _fit_member,
        in_roles=(None, BROADCAST, PER_CHAIN, None, None, None, None, None),
        mesh=mesh,
        axis=axis,
        block_size=block_size,
    )
    return step(ensemble, data, keys, optimizer, loss_fn, int(num_steps), batch_size, num_data)


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
