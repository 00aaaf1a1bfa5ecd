"""Particles in the user's structure outside, flat vectors inside.

SMC takes particles as any pytree of floating arrays with a leading particle axis, and a
log prior and log likelihood of ONE particle's pytree. The stage program and the
mutation kernels work on `(num_particles, dim)` vectors (kernels, metrics and the
population statistics are flat-vector code, as in `samplers.run`), so the particles are
raveled here once and unraveled in the result.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._errors import SamplerError, SamplerTypeError


def _leaf_name(path: tuple) -> str:
    """`params.w`, `[0]`, `theta` (as `samplers.run` names coordinates); `x` for the root."""
    name = ""
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            part = str(key.key)
        elif isinstance(key, jax.tree_util.GetAttrKey):
            part = key.name
        elif isinstance(key, jax.tree_util.SequenceKey):
            part = f"[{key.idx}]"
        else:
            part = str(key)
        name += part if part.startswith("[") or not name else "." + part
    return name or "x"


class Particles(eqx.Module):
    """The static structure of one particle's pytree: leaf shapes, dtype, coordinate names.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.smc._particles import Particles
        >>> s = Particles.of({"a": jnp.zeros(4), "b": jnp.zeros((4, 2))})
        >>> s.dim, s.names
        (3, ('a', 'b[0]', 'b[1]'))
        >>> s.unravel(jnp.arange(3.0))["b"].tolist()
        [1.0, 2.0]
    """

    treedef: Any = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    names: tuple[str, ...] = eqx.field(static=True)
    num_particles: int = eqx.field(static=True)

    @classmethod
    def of(cls, particles: Any, argument: str = "particles") -> "Particles":
        """The structure of `particles` (every leaf with the leading particle axis),
        checked: floating leaves of one dtype and one particle count."""
        leaves, treedef = jax.tree_util.tree_flatten_with_path(particles)
        if not leaves:
            raise SamplerError(
                f"{argument} is an empty pytree ({type(particles).__name__} with no arrays)."
                "\n  fix: pass draws from the prior with a leading particle axis, e.g. "
                "jax.random.normal(key, (num_particles, dim))."
            )
        names, shapes, dtypes, counts = [], [], [], []
        for path, leaf in leaves:
            name = _leaf_name(path)
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                raise SamplerTypeError(
                    f"{argument} leaf {name!r} is a {type(leaf).__name__}, not an array.\n"
                    "  fix: every leaf an array with a leading particle axis."
                )
            if not jnp.issubdtype(leaf.dtype, jnp.floating):
                raise SamplerTypeError(
                    f"{argument} leaf {name!r} has dtype {leaf.dtype}, not a floating dtype."
                    "\n  fix: make every leaf floating, e.g. x.astype(jnp.float32)."
                )
            if not np.shape(leaf):
                raise SamplerError(
                    f"{argument} leaf {name!r} is a scalar, but every leaf needs a leading "
                    "particle axis.\n  fix: stack one value per particle, shape "
                    "(num_particles, ...)."
                )
            names.append(name)
            shapes.append(tuple(np.shape(leaf))[1:])
            counts.append(np.shape(leaf)[0])
            dtypes.append(jnp.dtype(leaf.dtype))
        if len(set(counts)) > 1 or len(set(dtypes)) > 1:
            found = ", ".join(
                f"{n!r}: {c} x {s} {d}"
                for n, c, s, d in zip(names, counts, shapes, dtypes, strict=True)
            )
            raise SamplerError(
                f"{argument} leaves disagree in particle count or dtype ({found}).\n  fix: "
                "one dtype and the same number of particles along every leaf's first axis."
            )
        flat_names = []
        for name, shape in zip(names, shapes, strict=True):
            if not shape:
                flat_names.append(name)
            else:
                flat_names += [f"{name}[{', '.join(map(str, i))}]" for i in np.ndindex(*shape)]
        return cls(treedef, tuple(shapes), dtypes[0], tuple(flat_names), int(counts[0]))

    @property
    def dim(self) -> int:
        return len(self.names)

    def ravel(self, tree: Any) -> Float[Array, "*batch dim"]:
        """Leaves `(*batch, *shape)` -> `(*batch, dim)`."""
        leaves = self.treedef.flatten_up_to(tree)
        lead = jnp.ndim(leaves[0]) - len(self.shapes[0])
        batch = jnp.shape(leaves[0])[:lead]
        parts = [jnp.reshape(jnp.asarray(x), (*batch, -1)) for x in leaves]
        return jnp.concatenate(parts, axis=-1).astype(self.dtype)

    def unravel(self, flat: Float[Array, "*batch dim"]) -> Any:
        """`(*batch, dim)` -> the pytree with leaves `(*batch, *shape)`."""
        batch, start, leaves = flat.shape[:-1], 0, []
        for shape in self.shapes:
            size = int(np.prod(shape, dtype=int))
            leaves.append(flat[..., start : start + size].reshape(*batch, *shape))
            start += size
        return self.treedef.unflatten(leaves)

    def one(self) -> Any:
        """One particle's pytree of `jax.ShapeDtypeStruct` (for `jax.eval_shape`)."""
        return self.treedef.unflatten([jax.ShapeDtypeStruct(s, self.dtype) for s in self.shapes])


class Tempered(eqx.Module):
    """`log_prior(x) + beta * log_likelihood(x)` of one flat particle: the mutation
    kernels' target at inverse temperature `beta` (an array, so one compiled stage serves
    every temperature). The user's callables are fields, so arrays they hold stay operands.
    """

    log_prior: Any
    log_likelihood: Any
    structure: Particles
    beta: Float[Array, ""]

    def __call__(self, x: Float[Array, " dim"]) -> Float[Array, ""]:
        p = self.structure.unravel(x)
        ll = self.log_likelihood(p)
        # A zero likelihood (-inf) stays -inf at any beta > 0; beta = 0 never moves.
        return self.log_prior(p) + jnp.where(jnp.isneginf(ll), -jnp.inf, self.beta * ll)

    def parts(self, x: Float[Array, " dim"]) -> tuple[Array, Array]:
        """`(log prior, log likelihood)` of one flat particle."""
        p = self.structure.unravel(x)
        return jnp.asarray(self.log_prior(p)), jnp.asarray(self.log_likelihood(p))
