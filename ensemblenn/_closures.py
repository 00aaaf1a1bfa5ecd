"""Find the `jax.Array`s a function captures, and rebuild it with operands in their place.

A `shard_map` body must receive every array as an operand: on an Explicit mesh a captured
sharded array raises `NotImplementedError`, and on an Auto mesh a captured per-chain array
can silently broadcast against each shard. Discovery traces the function and reads the
constants of its jaxpr, including those kept inside nested `jax.jit` callees. Lifting
rebuilds the function with each captured array replaced, by identity, with the operand
that now carries it: through closure cells, the globals the code names, default
arguments, `functools.partial`, bound methods, `jax.jit` wrappers and pytrees (equinox
modules included).
"""

import functools
import types
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

_ATOMS = (
    jax.Array,
    np.ndarray,
    np.generic,
    type,
    types.ModuleType,
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    type(None),
    types.BuiltinFunctionType,
)


def jaxpr_constants(closed: Any) -> list[Any]:
    """The `jax.Array` constants of a ClosedJaxpr and of every jaxpr nested in it."""
    found: list[Any] = []
    seen: set[int] = set()

    def add(consts: Any) -> None:
        for c in consts:
            if isinstance(c, jax.Array) and id(c) not in seen:
                seen.add(id(c))
                found.append(c)

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            for param in eqn.params.values():
                for item in param if isinstance(param, (tuple, list)) else (param,):
                    if isinstance(item, jex_core.ClosedJaxpr):
                        add(item.consts)
                        walk(item.jaxpr)
                    elif isinstance(item, jex_core.Jaxpr):
                        walk(item)

    add(closed.consts)
    walk(closed.jaxpr)
    return found


def shard_map_captures(closed: Any) -> list[str]:
    """Descriptions of values that enter any `shard_map` body other than as operands.

    An empty list means every array inside each `shard_map` in `closed` is an explicit
    operand: the invariant ensemble_map guarantees.

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn
        >>> data = jnp.arange(3.0)
        >>> f = enn.ensemble_map(lambda x: x * data.sum(), in_roles=enn.PER_CHAIN)
        >>> enn.shard_map_captures(jax.make_jaxpr(f)(jnp.ones(4)))
        []
    """
    bad: list[str] = []

    def walk(jaxpr: Any, inside: bool) -> None:
        for eqn in jaxpr.eqns:
            is_shard_map = eqn.primitive.name == "shard_map"
            for param in eqn.params.values():
                for item in param if isinstance(param, (tuple, list)) else (param,):
                    if isinstance(item, jex_core.ClosedJaxpr):
                        if is_shard_map or inside:
                            bad.extend(
                                str(jax.typeof(c)) for c in item.consts if isinstance(c, jax.Array)
                            )
                        walk(item.jaxpr, inside or is_shard_map)
                    elif isinstance(item, jex_core.Jaxpr):
                        if is_shard_map:
                            bad.extend(str(v.aval) for v in item.constvars)
                        walk(item, inside or is_shard_map)

    walk(closed.jaxpr, False)
    return bad


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


class _Substituter:
    def __init__(self, table: dict[int, Any]):
        self.table = table
        self.memo: dict[int, Any] = {}

    def __call__(self, obj: Any) -> Any:
        key = id(obj)
        if key in self.table:
            return self.table[key]
        if key in self.memo:
            return self.memo[key]
        if isinstance(obj, _ATOMS):
            return obj
        self.memo[key] = obj  # cycles resolve to the original object
        new = self._rebuild(obj)
        self.memo[key] = new
        return new

    def _rebuild(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, functools.partial):
            func, args = self(obj.func), tuple(self(a) for a in obj.args)
            kwargs = {k: self(v) for k, v in obj.keywords.items()}
            unchanged = func is obj.func and all(a is b for a, b in zip(args, obj.args))
            if unchanged and all(kwargs[k] is obj.keywords[k] for k in kwargs):
                return obj
            return functools.partial(func, *args, **kwargs)
        if isinstance(obj, types.MethodType):
            func, owner = self(obj.__func__), self(obj.__self__)
            if func is obj.__func__ and owner is obj.__self__:
                return obj
            return types.MethodType(func, owner)
        wrapped = getattr(obj, "__wrapped__", None)
        if wrapped is not None and type(obj).__name__ == "PjitFunction":
            inner = self(wrapped)
            return obj if inner is wrapped else jax.jit(inner)
        try:
            leaves, treedef = jax.tree.flatten(obj)
        except (ValueError, TypeError):
            # e.g. a dict whose keys do not sort (JAX's own type-keyed tables): opaque
            return obj
        if treedef.num_nodes == 1 and treedef.num_leaves == 1 and leaves[0] is obj:
            return obj  # an opaque object: its arrays are out of reach
        new_leaves = [self(leaf) for leaf in leaves]
        if all(a is b for a, b in zip(new_leaves, leaves)):
            return obj
        return jax.tree.unflatten(treedef, new_leaves)

    def _function(self, fn: types.FunctionType) -> types.FunctionType:
        changed = False
        cells = fn.__closure__
        if cells:
            new_cells = []
            for cell in cells:
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell (a name bound later)
                    new_cells.append(cell)
                    continue
                new = self(value)
                changed |= new is not value
                new_cells.append(types.CellType(new) if new is not value else cell)
            cells = tuple(new_cells)
        globals_ = fn.__globals__
        replaced = {}
        for name in _code_names(fn.__code__):
            if name in globals_:
                new = self(globals_[name])
                if new is not globals_[name]:
                    replaced[name] = new
        if replaced:
            changed, globals_ = True, {**globals_, **replaced}
        defaults = fn.__defaults__
        if defaults:
            new_defaults = tuple(self(d) for d in defaults)
            if any(a is not b for a, b in zip(new_defaults, defaults)):
                changed, defaults = True, new_defaults
        kwdefaults = fn.__kwdefaults__
        if kwdefaults:
            new_kw = {k: self(v) for k, v in kwdefaults.items()}
            if any(new_kw[k] is not kwdefaults[k] for k in kwdefaults):
                changed, kwdefaults = True, new_kw
        if not changed:
            return fn
        new_fn = types.FunctionType(fn.__code__, globals_, fn.__name__, defaults, cells)
        new_fn.__kwdefaults__ = kwdefaults
        new_fn.__dict__.update(fn.__dict__)
        new_fn.__qualname__ = fn.__qualname__
        return new_fn


class _Finder(_Substituter):
    """Walks like `_Substituter` but only records the `jax.Array`s it can reach."""

    def __init__(self) -> None:
        super().__init__({})
        self.found: dict[int, Any] = {}

    def __call__(self, obj: Any) -> Any:
        if isinstance(obj, jax.Array):
            self.found.setdefault(id(obj), obj)
            return obj
        return super().__call__(obj)


def reachable_arrays(obj: Any) -> dict[int, Any]:
    """Every `jax.Array` the substitution walk can reach from `obj`, by id, in walk order.

    Cheap (no tracing); used to tell whether a function still captures the same arrays as
    when it was last traced.
    """
    finder = _Finder()
    finder(obj)
    return finder.found


def substitute(obj: Any, table: dict[int, Any]) -> Any:
    """`obj` rebuilt with every reachable object whose `id` is in `table` replaced."""
    return _Substituter(table)(obj)


def is_explicit_sharded(x: Any) -> bool:
    """True for an array typed on a mesh with an Explicit axis (illegal to capture)."""
    try:
        mesh = jax.typeof(x).sharding.mesh
    except (AttributeError, TypeError):
        return False
    return not mesh.empty and jax.sharding.AxisType.Explicit in mesh.axis_types


def describe_capture(x: Any) -> str:
    sharding = getattr(x, "sharding", None)
    where = "traced (from an outer jax.jit)" if isinstance(x, jax.core.Tracer) else str(sharding)
    return f"{jax.typeof(x)} {where}"
