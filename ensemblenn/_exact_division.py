"""Floating-point divisions computed exactly as written, whatever the device count.

XLA's algebraic simplifier rewrites divisions in ways that change the last bit:
`x / broadcast(s)` becomes `x * broadcast(1 / s)` and `(a / b) / c` becomes
`a / (b * c)`. Which rewrite fires depends on the surrounding program: the first needs the
broadcast to have a single user, and on more than one device the SPMD clean-up pipeline runs
common-subexpression elimination first, which merges the identical broadcasts of a shared
scalar. Adam divides every parameter leaf by the same bias correction `1 - b**t`, so on one
device those leaves were multiplied by a reciprocal and on two or more they were divided by
a product (measured on CPU, jax 0.10.2: leaves with a shape shared by another leaf differ in
the last bit after one step). MEADS's fold estimates (means divided by a fold's share, many
of them by the same broadcast) differed between one and four devices the same way.

`exact_divisions(fn)` evaluates `fn` with both operands of each floating-point division
behind an `optimization_barrier` (the divisor broadcast to the result's shape first), so no
pattern can see what they are made of and every device count divides the same numbers.
The price is that the operands of a division are materialised instead of fused.
"""

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

_T = TypeVar("_T")
# Call primitives whose body is evaluated here, so the divisions inside are covered too.
_INLINED = frozenset({"jit", "pjit", "closed_call", "core_call"})


def _exact_div(a: jax.Array, b: jax.Array) -> jax.Array:
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    a, b = jax.lax.optimization_barrier((jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)))
    return jax.lax.div(a, b)


def _eval(jaxpr: Any, consts: list, args: list) -> list:
    env: dict = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name == "div" and jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.inexact):
            out = [_exact_div(*invals)]
        elif name in _INLINED and isinstance(eqn.params.get("jaxpr"), jex_core.ClosedJaxpr):
            inner = eqn.params["jaxpr"]
            out = _eval(inner.jaxpr, list(inner.consts), invals)
        else:
            # As `jax.core.eval_jaxpr` binds an equation (older JAX also returned subfuns).
            params = eqn.primitive.get_bind_params(eqn.params)
            subfuns, params = params if isinstance(params, tuple) else ((), params)
            ctx = getattr(getattr(eqn, "ctx", None), "manager", contextlib.nullcontext())
            with ctx:
                out = eqn.primitive.bind(*subfuns, *invals, **params)
            out = out if eqn.primitive.multiple_results else [out]
        for var, value in zip(eqn.outvars, out):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def exact_divisions(fn: Callable[..., _T]) -> Callable[..., _T]:
    """`fn` with every floating-point division computed as written, protected from XLA's
    rewrites (`x / s` into `x * (1 / s)`, `(a / b) / c` into `a / (b * c)`), which fire
    differently for different device counts and change the last bit.

    Wrap per-chain code whose divisions share a divisor across many leaves (an optimizer's
    bias correction, a fold's share) when its results must be bitwise identical on any
    number of devices. Non-array arguments and outputs pass through statically, as in
    `eqx.filter_jit`. The operands of each division are materialised instead of fused.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, ensemblenn as enn
        >>> f = enn.exact_divisions(lambda x, s, d: x / s / d)
        >>> x, s, d = jnp.float32(1.7), jnp.float32(3.1), jnp.float32(0.7)
        >>> bool(jax.jit(f)(x, s, d) == np.float32(1.7) / np.float32(3.1) / np.float32(0.7))
        True
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        dynamic, static = eqx.partition((args, kwargs), eqx.is_array)
        leaves, treedef = jax.tree.flatten(dynamic)
        out_static: list = []

        def flat(*leaves: Any) -> list:
            a, k = eqx.combine(jax.tree.unflatten(treedef, list(leaves)), static)
            out_dynamic, out_rest = eqx.partition(fn(*a, **k), eqx.is_array)
            out_leaves, out_tree = jax.tree.flatten(out_dynamic)
            out_static[:] = [out_rest, out_tree]
            return out_leaves

        closed = jax.make_jaxpr(flat)(*leaves)
        out_rest, out_tree = out_static
        out_leaves = _eval(closed.jaxpr, list(closed.consts), leaves)
        return eqx.combine(jax.tree.unflatten(out_tree, out_leaves), out_rest)

    return wrapped
