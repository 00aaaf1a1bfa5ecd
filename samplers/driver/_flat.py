"""Ravel once at the driver boundary: users' pytree positions in, flat vectors inside.

`samplers.run` accepts positions as any pytree of floating arrays with a leading chain axis
(dict, tuple, NamedTuple, equinox Module) and a log density of ONE chain's pytree. The
driver ravels them here, once: kernels, adaptations, metrics, moments and checkpoints all
see `(num_chains, dim)` vectors, and results are unravelled on the way out. Carrying
pytrees through the kernels (as BlackJAX does) would make every kernel, metric and
adaptation pytree-generic for no gain in what they compute: a diagonal or dense metric is a
flat object anyway.

`Structure` holds the static facts (tree structure, leaf shapes, dtype, coordinate names);
`FlatTarget` wraps the user's log density (kept as a field, so that arrays it holds stay
operands of the `shard_map`, visible to the closure guard) into one of a flat vector, with a
flat `observable` of its own `Structure`.

Coordinates are named by path: `mu`, `theta_z[3]`, `params.w[1, 2]`; the only leaf of a
plain array is called `x` (`x[0]`, `x[1]`, ...). A plain `(num_chains, dim)` array is not
wrapped at all, so such runs are exactly as before.
"""

import functools
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

import ensemblenn as enn


class PositionsError(enn.EnsembleError):
    """Positions (or an observable) that are not a pytree the driver can ravel: a leaf that
    is not floating, leaves of different dtypes or chain counts, or no leaves at all.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> try:
        ...     samplers.run(samplers.RandomWalk(0.5), lambda p: -p["a"] ** 2,
        ...                  {"a": jnp.zeros(4), "n": jnp.zeros(4, jnp.int32)},
        ...                  key=jax.random.key(0), num_steps=2, progress=False)
        ... except samplers.PositionsError as err:
        ...     print(str(err).splitlines()[0])
        positions leaf 'n' has dtype int32, not a floating point dtype.
    """


PositionsError.__module__ = "samplers"  # its public name in tracebacks and docs


def _key_name(key: Any) -> str:
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.SequenceKey):
        return f"[{key.idx}]"
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return f"[{key.key}]"
    return str(key)


def path_name(path: tuple, root: str = "x") -> str:
    """A leaf's name from its key path: `params.w`, `[0]`, `theta_z`; `root` for the root."""
    name = ""
    for key in path:
        part = _key_name(key)
        name += part if part.startswith("[") or not name else "." + part
    return name or root


@functools.lru_cache(maxsize=8)
def _flat_names(
    leaf_names: tuple[str, ...], shapes: tuple[tuple[int, ...], ...]
) -> tuple[str, ...]:
    return tuple(c for n, s in zip(leaf_names, shapes, strict=True) for c in _element_names(n, s))


def _element_names(name: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{', '.join(map(str, i))}]" for i in np.ndindex(*shape)]


class Structure(eqx.Module):
    """The static structure of one chain's pytree and its flat coordinates.

    Attributes:
        treedef: the tree structure.
        leaf_names: one name per leaf (`mu`, `params.w`; `x` for a bare array).
        shapes: one chain's shape of each leaf.
        dtype: the one floating dtype of every leaf.
        names: one name per flat coordinate, in ravel order (`theta_z[3]`).
        plain: whether the pytree is one 1-D array (per chain): nothing to ravel.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.driver._flat import Structure
        >>> s = Structure.of({"mu": jnp.zeros(4), "theta": jnp.zeros((4, 2))}, batched=True)
        >>> s.names, s.dim
        (('mu', 'theta[0]', 'theta[1]'), 3)
        >>> s.unravel(jnp.arange(3.0))["theta"].tolist()
        [1.0, 2.0]
    """

    treedef: Any = eqx.field(static=True)
    leaf_names: tuple[str, ...] = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    plain: bool = eqx.field(static=True)

    @classmethod
    def of(cls, tree: Any, *, batched: bool, what: str = "positions") -> "Structure":
        """The structure of `tree` (with a leading chain axis on every leaf if `batched`),
        after checking the leaves' dtypes and chain counts (raising `PositionsError`)."""
        leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
        if not leaves:
            raise PositionsError(
                f"{what} is an empty pytree ({type(tree).__name__} with no arrays).\n  fix: "
                "give at least one floating array, e.g. {'x': jnp.zeros((num_chains, dim))}."
            )
        names, shapes, dtypes = [], [], []
        for path, leaf in leaves:
            name = path_name(path)
            dtype = jnp.result_type(leaf) if not hasattr(leaf, "dtype") else leaf.dtype
            if not jnp.issubdtype(dtype, jnp.floating):
                raise PositionsError(
                    f"{what} leaf {name!r} has dtype {dtype}, not a floating point dtype.\n  fix: "
                    f"make every leaf floating (e.g. .astype(jnp.float32)); integer or boolean "
                    "parameters cannot be sampled by these kernels."
                )
            names.append(name)
            shapes.append(tuple(np.shape(leaf)))
            dtypes.append(jnp.dtype(dtype))
        if len(set(dtypes)) > 1:
            found = ", ".join(f"{n!r}: {d}" for n, d in zip(names, dtypes, strict=True))
            raise PositionsError(
                f"{what} leaves have different dtypes ({found}).\n  fix: give every leaf the "
                "same floating dtype, e.g. jax.tree.map(lambda x: x.astype(jnp.float32), tree)."
            )
        if batched:
            for name, shape in zip(names, shapes, strict=True):
                if not shape:
                    raise PositionsError(
                        f"{what} leaf {name!r} is a scalar, but every leaf needs a leading "
                        "chain axis.\n  fix: stack one value per chain, shape (num_chains, ...)."
                    )
            chains = {s[0] for s in shapes}
            if len(chains) > 1:
                found = ", ".join(f"{n!r}: {s}" for n, s in zip(names, shapes, strict=True))
                raise PositionsError(
                    f"{what} leaves have different leading (chain) axes ({found}).\n  fix: "
                    "every leaf needs the same number of chains along its first axis."
                )
            shapes = [s[1:] for s in shapes]
        plain = treedef.num_leaves == 1 and len(shapes[0]) == 1 and not leaves[0][0]
        return cls(treedef, tuple(names), tuple(shapes), dtypes[0], plain)

    @property
    def names(self) -> tuple[str, ...]:
        # Made when read (summaries, exports), not per run: one string per coordinate would
        # cost every call ~1 ms per 10 000 coordinates, and a static field is hashed into
        # each program's cache key.
        return _flat_names(self.leaf_names, self.shapes)

    @property
    def dim(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes)

    def one_chain(self) -> Any:
        """One chain's pytree of `jax.ShapeDtypeStruct` leaves (for `jax.eval_shape`)."""
        leaves = [jax.ShapeDtypeStruct(s, self.dtype) for s in self.shapes]
        return self.treedef.unflatten(leaves)

    def ravel(self, tree: Any) -> Float[Array, "*batch dim"]:
        """One flat vector per leading index: leaves `(*batch, *shape)` -> `(*batch, dim)`."""
        leaves = self.treedef.flatten_up_to(tree)
        if self.plain:
            return jnp.asarray(leaves[0])
        batch = jnp.shape(leaves[0])[: jnp.ndim(leaves[0]) - len(self.shapes[0])]
        parts = [jnp.reshape(x, (*batch, -1)) for x in leaves]
        return jnp.concatenate(parts, axis=-1).astype(self.dtype)

    def unravel(self, flat: Float[Array, "*batch dim"]) -> Any:
        """The pytree of flat vectors `(*batch, dim)`: leaves `(*batch, *shape)`."""
        if self.plain:
            return self.treedef.unflatten([flat])
        batch, start, leaves = flat.shape[:-1], 0, []
        for shape in self.shapes:
            size = int(np.prod(shape, dtype=int))
            leaves.append(flat[..., start : start + size].reshape(*batch, *shape))
            start += size
        return self.treedef.unflatten(leaves)


def _identity(x: Any) -> Any:
    return x


class FlatTarget(eqx.Module):
    """The user's log density (and observable) of one chain's pytree, as functions of one
    flat vector. The user's callable is a field, so that arrays it holds stay visible.

    Attributes:
        logdensity: the user's log density (a function or a target module).
        position: the `Structure` of one chain's position.
        observed: the `Structure` of one chain's observable (the position's without one).

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.driver._flat import FlatTarget, Structure
        >>> s = Structure.of({"a": jnp.zeros((2, 1)), "b": jnp.zeros(2)}, batched=True)
        >>> flat = FlatTarget(lambda p: -(p["a"] ** 2).sum() - p["b"] ** 2, s, s)
        >>> float(flat(jnp.array([1.0, 2.0])))
        -5.0
    """

    logdensity: Callable
    position: Structure
    observed: Structure

    def __call__(self, x: Float[Array, " dim"], *args: Any) -> Any:
        return self.logdensity(self.position.unravel(x), *args)

    def observable(self, x: Float[Array, " dim"]) -> Float[Array, " obs"]:
        observe = getattr(self.logdensity, "observable", _identity)
        return self.observed.ravel(observe(self.position.unravel(x)))

    @property
    def reference(self) -> Any:
        return getattr(self.logdensity, "reference", None)


def float64_leaves(tree: Any) -> list[str]:
    """The names of `tree`'s leaves that hold float64 (numpy arrays and scalars, Python
    floats) while JAX computes in float32 (`jax_enable_x64` off), which `jnp.asarray`
    converts to float32 without a word; empty with x64 on.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> from samplers.driver._flat import float64_leaves
        >>> float64_leaves({"a": np.zeros((4, 2)), "b": np.zeros(4, np.float32), "c": jnp.ones(4)})
        ['a']
        >>> float64_leaves(np.zeros((4, 2)))  # a plain array: the root, named "x"
        ['x']
    """
    if jax.dtypes.canonicalize_dtype(np.float64) == np.float64:
        return []  # x64 on: float64 stays float64
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, jax.Array):
            continue  # already JAX's: float32 unless x64 is on
        dtype = np.float64 if isinstance(leaf, float) else getattr(leaf, "dtype", None)
        if dtype is not None and np.dtype(dtype) == np.float64:
            names.append(path_name(path))
    return names


def float64_message(names: list[str], plain: bool, what: str = "positions") -> str:
    """The `PrecisionWarning` about the float64 leaves `names` (`plain`: `what` is one
    array, not a pytree).

    Example:
        >>> from samplers.driver._flat import float64_message
        >>> print(float64_message(["theta", "mu"], plain=False).splitlines()[0])
        positions leaves 'theta', 'mu' have dtype float64, but jax_enable_x64 is off: they are sampled in float32.
    """  # noqa: E501
    if plain:
        subject, verb, pronoun = what, "has", "it is"
    elif len(names) == 1:
        subject, verb, pronoun = f"{what} leaf {names[0]!r}", "has", "it is"
    else:
        quoted = ", ".join(repr(n) for n in names)
        subject, verb, pronoun = f"{what} leaves {quoted}", "have", "they are"
    return (
        f"{subject} {verb} dtype float64, but jax_enable_x64 is off: {pronoun} sampled in "
        'float32.\n  fix: call jax.config.update("jax_enable_x64", True) before creating '
        "any arrays to sample in float64, or pass float32 positions (x.astype(np.float32)) "
        "to sample in float32 without this warning."
    )


def flatten_target(logdensity: Callable, positions: Any) -> tuple[Any, Any, Structure, Structure]:
    """`(flat logdensity, flat positions, position structure, observable structure)`.

    A plain `(num_chains, dim)` array and a log density whose observable (if any) returns a
    1-D array are passed through unwrapped: such runs are exactly as they were.
    """
    position = Structure.of(positions, batched=True)
    flat = position.ravel(positions)
    one = position.one_chain()
    observe = getattr(logdensity, "observable", None)
    observed = position
    if observe is not None:
        try:
            shapes = jax.eval_shape(observe, one)
        except Exception as err:
            # The user's own exception: re-raised as itself, with samplers.run's context.
            err.add_note(
                "samplers.run: raised by logdensity.observable, called on ONE chain's "
                "position (traced, before anything compiles).\n  fix: observable takes one "
                "chain's position (the structure of positions without the chain axis)."
            )
            raise
        observed = Structure.of(shapes, batched=False, what="observable(position)")
    if position.plain and observed.plain:
        return logdensity, flat, position, observed
    return FlatTarget(logdensity, position, observed), flat, position, observed
