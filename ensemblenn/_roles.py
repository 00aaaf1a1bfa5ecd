"""Partition roles and the equinox field specifiers that record them.

A role says how an array leaf is laid out over the ensemble:

* `PER_CHAIN`: the leading axis is the ensemble axis. It is sharded over the mesh, and a
  function written for one chain sees the leaf without that axis.
* `BROADCAST`: one value shared by every chain, replicated on every device.

An array leaf that carries no role (no field metadata, no `in_roles` entry) is
`BROADCAST`: data, parameters and hyperparameters are shared unless you say otherwise.
Pass `strict=True` to `partition` or `ensemble_map` to make an untagged array an error.
"""

import dataclasses
import enum
from typing import Any

import equinox as eqx

from ._errors import RoleError

ROLE_METADATA_KEY = "ensemblenn.role"


class Role(enum.Enum):
    """How an array leaf is partitioned over the ensemble.

    Example:
        >>> import ensemblenn as enn
        >>> enn.Role.PER_CHAIN is enn.PER_CHAIN, enn.Role("broadcast")
        (True, enn.BROADCAST)
        >>> [role.value for role in enn.Role]
        ['per-chain', 'broadcast']
    """

    PER_CHAIN = "per-chain"
    BROADCAST = "broadcast"

    def __repr__(self) -> str:
        return f"enn.{self.name}"

    __str__ = __repr__


PER_CHAIN = Role.PER_CHAIN
BROADCAST = Role.BROADCAST


def _role_field(role: Role, field_kwargs: dict[str, Any]) -> Any:
    if field_kwargs.get("static", False):
        raise RoleError(
            f"A field cannot be both `static=True` and {role}: static fields are not array "
            "leaves, so they are never partitioned.\n"
            f"  wrong: x: float = enn.{role.name.lower()}(static=True)\n"
            f"  fix:   x: float = eqx.field(static=True)      # a compile-time constant\n"
            f"    or:  x: Array = enn.{role.name.lower()}()   # an array with a role"
        )
    metadata = dict(field_kwargs.pop("metadata", None) or {})
    metadata[ROLE_METADATA_KEY] = role
    return eqx.field(metadata=metadata, **field_kwargs)


def per_chain(**field_kwargs: Any) -> Any:
    """An equinox field whose array leaves have one row per chain.

    Every `eqx.field` keyword (`default`, `converter`, ...) passes through.

    Example:
        >>> import equinox as eqx, jax.numpy as jnp, ensemblenn as enn
        >>> class State(eqx.Module):
        ...     position: jnp.ndarray = enn.per_chain()
        ...     step_size: jnp.ndarray = enn.broadcast()
        >>> enn.role_of(State, "position")
        enn.PER_CHAIN
    """
    return _role_field(PER_CHAIN, field_kwargs)


def broadcast(**field_kwargs: Any) -> Any:
    """An equinox field whose array leaves are shared by every chain (replicated).

    Every `eqx.field` keyword passes through.

    Example:
        >>> import equinox as eqx, jax.numpy as jnp, ensemblenn as enn
        >>> class Target(eqx.Module):
        ...     data: jnp.ndarray = enn.broadcast()
        >>> enn.role_of(Target, "data")
        enn.BROADCAST
    """
    return _role_field(BROADCAST, field_kwargs)


def declared_role(field: dataclasses.Field) -> Role | None:
    """The role recorded in a dataclass field's metadata, if any."""
    return field.metadata.get(ROLE_METADATA_KEY)


def role_of(module: Any, field_name: str) -> Role | None:
    """The role declared on a field of an equinox Module (class or instance).

    Returns `None` for a field without a role (its array leaves are then `BROADCAST`
    unless `in_roles` says otherwise).

    Example:
        >>> import equinox as eqx, jax.numpy as jnp, ensemblenn as enn
        >>> class Walker(eqx.Module):
        ...     x: jnp.ndarray = enn.per_chain()
        ...     scale: float = 1.0
        >>> enn.role_of(Walker(jnp.zeros((4, 2))), "x"), enn.role_of(Walker, "scale")
        (enn.PER_CHAIN, None)
    """
    cls = module if isinstance(module, type) else type(module)
    if not dataclasses.is_dataclass(cls):
        raise RoleError(f"role_of expects an equinox Module, got {cls.__name__}.")
    for field in dataclasses.fields(cls):
        if field.name == field_name:
            return declared_role(field)
    names = ", ".join(f.name for f in dataclasses.fields(cls))
    raise RoleError(f"{cls.__name__} has no field {field_name!r}; its fields are: {names}.")
