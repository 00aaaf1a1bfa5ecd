"""Deep ensembles: every member trained by its own optimizer, and their mean prediction.

Framework code, not MCMC: an ensemble of equinox models with optax states, built, trained
and evaluated with `ensemble_map` (the SG-MCMC posteriors of networks live in
`samplers.ensembles`)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree

from ._batch_invariant import batch_invariant
from ._collectives import chain_mean
from ._ensemble_map import ensemble_map
from ._errors import EnsembleError
from ._exact_division import exact_divisions
from ._per_chain_value import PerChainValue
from ._random import chain_keys
from ._roles import BROADCAST, PER_CHAIN, per_chain

LossFn = Callable[[PyTree, PyTree], Float[Array, ""]]
"""`loss_fn(model, batch) -> scalar` for one model."""


def _params(model: PyTree) -> PyTree:
    """The trainable part of a model: its floating-point arrays."""
    return eqx.filter(model, eqx.is_inexact_array)


def _num_examples(data: PyTree) -> int:
    """The shared leading (example) axis of the training data."""
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(data)}
    if len(sizes) != 1 or None in sizes:
        raise EnsembleError(
            "data must be a pytree of arrays sharing a leading (example) axis, got leading "
            f"sizes {sorted(map(str, sizes))}.\n  fix: stack the examples along axis 0 of "
            "every leaf, e.g. (x of shape (n, ...), y of shape (n, ...))."
        )
    return int(next(iter(sizes)))


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
        >>> ens = enn.init_ensemble(lambda k: eqx.nn.Linear(2, 1, key=k),
        ...                         optax.sgd(0.1), jax.random.key(0), 4)
        >>> isinstance(ens, enn.DeepEnsemble), ens.num_members, ens.model.weight.shape
        (True, 4, (4, 1, 2))
        >>> enn.role_of(ens, "model"), enn.role_of(ens, "opt_state")
        (enn.PER_CHAIN, enn.PER_CHAIN)
    """

    model: PyTree = per_chain()
    opt_state: optax.OptState = per_chain()

    @property
    def num_members(self) -> int:
        """The ensemble size (the leading axis of the model's arrays)."""
        return int(jax.tree.leaves(eqx.filter(self.model, eqx.is_array))[0].shape[0])


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
            raise EnsembleError(
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
        values = {k: v.value if isinstance(v, PerChainValue) else v for k, v in hyperparams.items()}
        opt_state = _set_hyperparams(opt_state, values)
    return DeepEnsemble(model, opt_state)


def init_ensemble(
    make_model: Callable[[PRNGKeyArray], PyTree],
    optimizer: optax.GradientTransformation,
    key: PRNGKeyArray,
    num_members: int,
    *,
    hyperparams: dict[str, float | ArrayLike | PerChainValue] | None = None,
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
        >>> make = lambda key: eqx.nn.MLP(1, 1, 8, 1, key=key)
        >>> opt = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
        >>> ens = enn.init_ensemble(make, opt, jax.random.key(0), 4,
        ...     hyperparams={"learning_rate": enn.PerChainValue(jnp.array([0., .1, .2, .3]))})
        >>> ens.num_members, ens.model.layers[0].weight.shape
        (4, (4, 8, 1))
        >>> [round(lr, 2) for lr in ens.opt_state.hyperparams["learning_rate"].tolist()]
        [0.0, 0.1, 0.2, 0.3]
    """
    if isinstance(num_members, bool) or not isinstance(num_members, (int, np.integer)):
        raise EnsembleError(f"num_members must be an int, got {num_members!r}.")
    keys = chain_keys(key, int(num_members))
    init = ensemble_map(_init_member, in_roles=(None, None, PER_CHAIN, None), mesh=mesh, axis=axis)
    return init(make_model, optimizer, keys, dict(hyperparams or {}))


def train_step(
    member: DeepEnsemble,
    batch: PyTree,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
) -> tuple[DeepEnsemble, Float[Array, ""]]:
    """One optimizer step of ONE member; run it over the ensemble with `ensemble_map`.

    Only the model's floating-point arrays are differentiated and updated; everything
    else (activation functions, integer buffers) passes through unchanged. The
    optimizer's floating-point divisions are computed as written (their operands are
    hidden from XLA's algebraic rewrites), so an update has the same bits on any number
    of devices.

    Args:
        member: one member (`DeepEnsemble` leaves without the member axis).
        batch: the data for this step, as `loss_fn` wants it (broadcast to all members).
        optimizer: the optax optimizer the state was made with.
        loss_fn: `loss_fn(model, batch) -> scalar`.

    Returns:
        `(member, loss)`: the updated member and the loss before the update.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax, ensemblenn as enn
        >>> opt = optax.sgd(0.1)
        >>> ens = enn.init_ensemble(lambda k: eqx.nn.Linear(2, 1, key=k), opt,
        ...                         jax.random.key(0), 8)
        >>> loss = lambda m, b: jnp.mean((jax.vmap(m)(b[0]) - b[1]) ** 2)
        >>> step = enn.ensemble_map(enn.train_step)
        >>> ens, losses = step(ens, (jnp.ones((5, 2)), jnp.zeros((5, 1))), opt, loss)
        >>> losses.shape
        (8,)
    """
    params, rest = eqx.partition(member.model, eqx.is_inexact_array)
    loss, grads = jax.value_and_grad(lambda p: loss_fn(eqx.combine(p, rest), batch))(params)
    # Divisions kept as written (Adam's bias corrections): the same bits on any device count.
    updates, opt_state = exact_divisions(optimizer.update)(grads, member.opt_state, params)
    return DeepEnsemble(eqx.apply_updates(member.model, updates), opt_state), loss


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
            member_key = jax.random.fold_in(key, t)
            idx = jax.random.choice(member_key, num_data, (batch_size,), replace=False)
            batch = jax.tree.map(lambda a: a[idx], data)
        # In blocks of members (the ensemble_map's block_size): the same bits on any
        # number of devices.
        member, loss = batch_invariant(train_step)(member, batch, optimizer, loss_fn)
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
            `enn.ensemble_map`). With the default `"auto"`, training gives the same bits
            on any number of devices (tested with SGD with momentum, Adam and RMSProp;
            `train_step` keeps the optimizer's divisions as written, which XLA would
            otherwise rewrite differently on one device and on several). `None` trains a
            device's members in one batch.

    Returns:
        `(ensemble, losses)`: the trained ensemble and each member's loss before each
        step, shape `(num_members, num_steps)`.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax, ensemblenn as enn
        >>> x = jnp.linspace(-1, 1, 16)[:, None]
        >>> opt = optax.adam(1e-2)
        >>> ens = enn.init_ensemble(lambda k: eqx.nn.MLP(1, 1, 4, 1, key=k), opt,
        ...                         jax.random.key(0), 4)
        >>> loss = lambda m, b: jnp.mean((jax.vmap(m)(b[0]) - b[1]) ** 2)
        >>> ens, losses = enn.fit(ens, (x, 2 * x), opt, loss, num_steps=20,
        ...                       batch_size=8, key=jax.random.key(1))
        >>> losses.shape
        (4, 20)
    """
    if not isinstance(ensemble, DeepEnsemble):
        raise EnsembleError(
            f"fit expects a DeepEnsemble (from init_ensemble), got {type(ensemble).__name__}."
        )
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise EnsembleError(f"num_steps must be an int >= 1, got {num_steps!r}.")
    num_data = _num_examples(data)
    keys = None
    if batch_size is not None:
        if not 1 <= batch_size <= num_data:
            raise EnsembleError(
                f"batch_size must be in [1, {num_data}] (the number of examples), got "
                f"{batch_size!r}."
            )
        if key is None:
            raise EnsembleError("fit: minibatches (batch_size=...) need a key=.")
        keys = chain_keys(key, ensemble.num_members)
    step = ensemble_map(
        _fit_member,
        in_roles=(None, BROADCAST, PER_CHAIN, None, None, None, None, None),
        mesh=mesh,
        axis=axis,
        block_size=block_size,
    )
    return step(ensemble, data, keys, optimizer, loss_fn, int(num_steps), batch_size, num_data)


ApplyFn = Callable[[PyTree, Array], Array]
"""`apply(model, x) -> predictions` for a batch of inputs `x`."""


def _apply_per_example(model: PyTree, x: Array) -> Array:
    # equinox layers act on one example; a batch is a vmap.
    return jax.vmap(model)(x)


def _predict_member(model: PyTree, x: Array, apply: ApplyFn) -> Any:
    return chain_mean(apply(model, x))


def predict(
    models: "DeepEnsemble | PyTree",
    x: Float[ArrayLike, "batch ..."],
    *,
    apply: ApplyFn | None = None,
    mesh: Any = None,
    axis: str = "chains",
) -> PyTree:
    """The ensemble-mean prediction at inputs `x`.

    Args:
        models: a `DeepEnsemble`, or a model whose arrays carry a leading member axis.
        x: a batch of inputs, broadcast to every member.
        apply: `apply(model, x) -> predictions` for one model; default
            `jax.vmap(model)(x)` (equinox layers act on one example).
        mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
        axis: the mesh axis the members are sharded over.

    Returns:
        The mean over members of `apply(model, x)`, replicated.

    Example:
        >>> import jax, jax.numpy as jnp, equinox as eqx, optax, ensemblenn as enn
        >>> ens = enn.init_ensemble(lambda k: eqx.nn.Linear(1, 1, key=k),
        ...                         optax.sgd(0.1), jax.random.key(0), 4)
        >>> x = jnp.ones((3, 1))
        >>> manual = (ens.model.weight[:, 0, 0] + ens.model.bias[:, 0]).mean()
        >>> bool(jnp.allclose(enn.predict(ens, x), manual))
        True
    """
    if isinstance(models, DeepEnsemble):
        models = models.model
    mapped = ensemble_map(
        _predict_member,
        in_roles=(PER_CHAIN, BROADCAST, None),
        out_roles=BROADCAST,
        mesh=mesh,
        axis=axis,
    )
    return mapped(models, x, apply or _apply_per_example)
