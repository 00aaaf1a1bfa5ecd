"""Split a pytree into explicit `shard_map` operands, one PartitionSpec each, and statics.

The role of an array leaf is decided, strongest first, by: an `in_roles` entry covering
it; the nearest enclosing field whose metadata carries a role; the default `BROADCAST`
(or an error in strict mode). A role applies to every array leaf inside the field:
nested modules, dicts, tuples, NamedTuples, optax states and PRNG key arrays alike.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np
from jax.sharding import PartitionSpec as P
from jaxtyping import PyTree

from ._errors import ChainCountError, EnsembleError, EnsembleTypeError, RoleError
from ._roles import BROADCAST, PER_CHAIN, Role, declared_role


class LeafInfo(NamedTuple):
    """An array leaf, where it sits, and its role."""

    path: str
    value: Any
    role: Role


def describe(value: Any) -> str:
    """`float32[8,3]`-style description of an array, or the type of anything else."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        try:
            return (
                str(jax.typeof(value))
                if isinstance(value, jax.Array)
                else (f"{np.dtype(value.dtype).name}{list(value.shape)}")
            )
        except TypeError:
            return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__


def _children(node: Any) -> tuple[list[tuple[str, Any]], Any]:
    """One level of a pytree: ((key string, child) list, treedef of that level)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [(jax.tree_util.keystr(path), child) for path, child in flat], treedef


def _field_roles(node: Any) -> dict[str, Role | None]:
    if isinstance(node, eqx.Module) or dataclasses.is_dataclass(node):
        return {f.name: declared_role(f) for f in dataclasses.fields(node)}
    return {}


def _is_scalar_constant(x: Any) -> bool:
    return isinstance(x, (bool, int, float, complex, str, bytes))


def _check_role_value(role: Any, path: str, name: str = "in_roles") -> None:
    if isinstance(role, P):
        raise RoleError(
            f"{name} at {path} is {role}, a PartitionSpec; {name} takes roles, and "
            "ensemblenn derives the specs from them.\n  fix: enn.PER_CHAIN for P(axis), "
            "enn.BROADCAST for P()."
        )
    if role is not None and not isinstance(role, Role):
        raise RoleError(
            f"{name} at {path} is {role!r} (a {type(role).__name__}); each entry must be "
            "enn.PER_CHAIN, enn.BROADCAST, None (use the field metadata) or a container of "
            "those matching the argument's structure.\n"
            f"  fix: {name}=(enn.PER_CHAIN, enn.BROADCAST)"
        )


def resolve_roles(
    tree: PyTree,
    *,
    in_roles: Any = None,
    strict: bool = False,
    root: str = "",
    default: Role | None = BROADCAST,
    roles_name: str = "in_roles",
) -> list[LeafInfo]:
    """The array leaves of `tree` in flattening order, each with its path and role.

    `roles_name` is what error messages call `in_roles` (`"out_roles"` for outputs).

    Raises:
        RoleError: an invalid `in_roles` entry or structure, a per-chain role placed
            directly on a non-array, or (strict mode) an array with no role.
    """
    # The roles depend on the structure only (tree shape, classes and their field roles,
    # which leaves are arrays or scalars), not on the values: resolve each structure once.
    leaves, treedef = jax.tree.flatten(tree)
    kinds = tuple(2 if eqx.is_array(x) else 1 if _is_scalar_constant(x) else 0 for x in leaves)
    try:
        key = (treedef, kinds, in_roles, strict, root, default, roles_name)
        cached = _RESOLVED.get(key)
    except (TypeError, ValueError):  # unhashable in_roles (a list) or static field
        key, cached = None, None
    if cached is not None:
        arrays = [x for x, kind in zip(leaves, kinds) if kind == 2]
        return [LeafInfo(path, x, role) for (path, role), x in zip(cached, arrays)]
    out = _walk_roles(tree, in_roles, strict, root, default, roles_name)
    if key is not None and len(out) == kinds.count(2):
        _RESOLVED[key] = [(i.path, i.role) for i in out]
        if len(_RESOLVED) > _MAX_RESOLVED:
            _RESOLVED.pop(next(iter(_RESOLVED)))
    return out


_RESOLVED: dict = {}
_MAX_RESOLVED = 1024


def _walk_roles(
    tree: PyTree, in_roles: Any, strict: bool, root: str, default: Role | None, name: str
) -> list[LeafInfo]:
    out: list[LeafInfo] = []
    noun, one = ("output", "output") if name == "out_roles" else ("arguments", "argument")

    def walk(
        node: Any,
        path: str,
        forced: Role | None,
        declared: Role | None,
        roles_prefix: Any,
        direct: bool,
    ) -> None:
        if roles_prefix is not None and not isinstance(roles_prefix, Role):
            # Descend the in_roles prefix alongside the tree.
            pkids, ptreedef = _children(roles_prefix)
            if len(pkids) == 1 and pkids[0][1] is roles_prefix:
                _check_role_value(roles_prefix, path or "the top level", name)
            kids, treedef = _children(node)
            if treedef != ptreedef:
                raise RoleError(
                    f"{name} does not match the {noun} at {path or 'the top level'}: the "
                    f"{one} is "
                    f"{treedef_summary(treedef)} but {name} is "
                    f"{treedef_summary(ptreedef)}.\n  fix: give {name} the same structure "
                    f"as the {noun} down to where a role applies, or a single role for a "
                    f"whole subtree (e.g. {name}=(enn.PER_CHAIN, None))."
                )
            fields = _field_roles(node)
            for (key, child), (_, pchild) in zip(kids, pkids, strict=True):
                f_role = fields.get(key.lstrip("."))
                walk(child, path + key, None, f_role or declared, pchild, f_role is not None)
            return
        if isinstance(roles_prefix, Role):
            forced, declared, direct = roles_prefix, roles_prefix, True
        if eqx.is_array(node):
            role = forced or declared
            if role is None:
                if strict:
                    raise RoleError(
                        f"{path or 'the argument'} is an array ({describe(node)}) with no role, "
                        "and strict mode requires one.\n  fix: declare the field with "
                        f"enn.per_chain() or enn.broadcast(), or pass {name}."
                    )
                role = default
            out.append(LeafInfo(path, node, role))
            return
        kids, _ = _children(node)
        if len(kids) == 1 and kids[0][1] is node:
            if direct and (forced or declared) is PER_CHAIN and _is_scalar_constant(node):
                raise RoleError(
                    f"{path} is marked {PER_CHAIN} but holds {node!r} (a "
                    f"{type(node).__name__}), not an array: a per-chain leaf needs a leading "
                    "ensemble axis.\n  fix: store one value per chain, e.g. "
                    "jnp.full((num_chains,), value), or mark the field enn.broadcast()."
                )
            return
        fields = _field_roles(node)
        for key, child in kids:
            f_role = fields.get(key.lstrip("."), None) if forced is None else None
            walk(child, path + key, forced, f_role or declared, None, f_role is not None)

    walk(tree, root, None, None, in_roles, False)
    return out


def treedef_summary(treedef: Any) -> str:
    text = str(treedef)
    return text if len(text) < 120 else text[:117] + "..."


def spec_for(role: Role, axis: str) -> P:
    """`P(axis)` for a per-chain leaf, `P()` for a broadcast one."""
    return P(axis) if role is PER_CHAIN else P()


def count_chains(infos: Sequence[LeafInfo]) -> int | None:
    """The ensemble size shared by every per-chain leaf, or None if there are none.

    Raises:
        ChainCountError: a per-chain leaf is a scalar, or leading sizes disagree.
    """
    sizes: dict[int, list[LeafInfo]] = {}
    for info in infos:
        if info.role is not PER_CHAIN:
            continue
        shape = np.shape(info.value)
        if len(shape) == 0:
            raise ChainCountError(
                f"{info.path} is {describe(info.value)} with role {PER_CHAIN}, but a per-chain "
                "leaf needs a leading ensemble axis and this one is a scalar.\n  fix: stack one "
                "value per chain (shape (num_chains, ...)) or make it enn.BROADCAST."
            )
        sizes.setdefault(shape[0], []).append(info)
    if not sizes:
        return None
    if len(sizes) > 1:
        lines = "\n".join(
            f"  leading size {n}: " + ", ".join(f"{i.path}: {describe(i.value)}" for i in leaves)
            for n, leaves in sizes.items()
        )
        raise ChainCountError(
            "Per-chain leaves disagree on the number of chains (their leading axis):\n"
            f"{lines}\n  fix: every {PER_CHAIN} leaf must have shape (num_chains, ...); mark "
            "shared values enn.BROADCAST."
        )
    return next(iter(sizes))


def partition(
    tree: PyTree,
    *,
    axis: str = "chains",
    in_roles: Any = None,
    strict: bool = False,
) -> tuple[PyTree, PyTree, PyTree]:
    """Split a pytree into array operands, one PartitionSpec per array, and statics.

    Args:
        tree: any pytree: equinox Modules, dicts, tuples, NamedTuples, optax states.
        axis: the mesh axis name that per-chain leaves are sharded over.
        in_roles: a pytree prefix of `tree` whose `enn.PER_CHAIN` / `enn.BROADCAST`
            entries override field metadata for every array leaf below them; `None`
            entries defer to the metadata.
        strict: if True, an array leaf with no role is an error instead of broadcast.

    Returns:
        `(operands, specs, static)`: `operands` has the array leaves (None elsewhere),
        `specs` a `PartitionSpec` at each array leaf (`P(axis)` per-chain, `P()`
        broadcast), and `static` the rest. `combine(operands, static)` rebuilds `tree`.

    Example:
        >>> import equinox as eqx, jax.numpy as jnp, ensemblenn as enn
        >>> class Walkers(eqx.Module):
        ...     x: jnp.ndarray = enn.per_chain()
        ...     scale: jnp.ndarray = enn.broadcast()
        ...     name: str = "rw"
        >>> operands, specs, static = enn.partition(Walkers(jnp.zeros((8, 2)), jnp.ones(2)))
        >>> specs.x, specs.scale
        (P('chains',), P())
    """
    if not isinstance(axis, str):
        raise EnsembleTypeError(f"axis must be a mesh axis name (a str), got {axis!r}.")
    if not isinstance(strict, bool):
        raise EnsembleTypeError(f"strict must be True or False, got {strict!r}.")
    infos = resolve_roles(tree, in_roles=in_roles, strict=strict)
    count_chains(infos)
    specs_iter = iter([spec_for(i.role, axis) for i in infos])
    operands, static = eqx.partition(tree, eqx.is_array)
    specs = jax.tree.map(lambda _: next(specs_iter), operands)
    return operands, specs, static


def combine(operands: PyTree, static: PyTree) -> PyTree:
    """Inverse of `partition`: put the operands back into the static remainder.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> tree = {"x": jnp.zeros(4), "n": 3}
        >>> ops, specs, static = enn.partition(tree)
        >>> enn.combine(ops, static)["n"]
        3

    Raises:
        EnsembleError: the two trees do not have the same structure (they must come from
            the same `partition`, or trees built like its outputs).
    """
    try:
        return eqx.combine(operands, static)
    except (ValueError, TypeError):  # jax's pytree mismatch: say which leaves differ
        pass
    is_none = lambda x: x is None  # noqa: E731 - the holes eqx.partition leaves
    paths = [
        {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(t, is_none)}
        for t in (operands, static)
    ]
    only_a, only_b = sorted(paths[0] - paths[1])[:3], sorted(paths[1] - paths[0])[:3]
    where = (
        f"leaves only in operands: {only_a or 'none'}; only in static: {only_b or 'none'}"
        if only_a or only_b
        else "the same leaf paths but different node types or metadata"
    )
    raise EnsembleError(
        f"combine(operands, static): the trees have different structures ({where}).\n"
        "  fix: pass the operands and static of the same enn.partition(tree) call (the "
        "operands may be transformed leaf by leaf, e.g. by jax.tree.map)."
    )
