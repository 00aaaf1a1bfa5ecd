"""Which mesh an ensemble runs on, and putting operands on it."""

import functools
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ._errors import MeshError, MeshTypeError


@functools.cache
def default_mesh(axis: str = "chains") -> Mesh:
    """A 1-D mesh over every device, with an Auto axis named `axis`.

    Auto, not Explicit (which `jax.make_mesh` defaults to), so that the per-chain arrays
    `ensemble_map` returns can go straight into ordinary JAX code. Explicit meshes are
    fully supported when passed in or set with `jax.set_mesh`.

    Example:
        >>> import ensemblenn as enn
        >>> enn.default_mesh().axis_names
        ('chains',)
    """
    devices = jax.devices()
    return jax.make_mesh((len(devices),), (axis,), axis_types=(AxisType.Auto,))


def _context_mesh() -> Any:
    try:
        mesh = jax.sharding.get_mesh()
    except ValueError:  # inside jax.jit: only the abstract mesh is visible
        mesh = jax.sharding.get_abstract_mesh()
    return None if mesh is None or mesh.empty else mesh


def resolve_mesh(mesh: Any = None, axis: str = "chains") -> Any:
    """The mesh an ensemble runs on: `mesh` if given, else the one set with `jax.set_mesh`
    (or the abstract mesh inside `jax.jit`), else `default_mesh(axis)`.

    Raises:
        MeshError: `mesh` is not a mesh, or it has no axis named `axis`.

    Example:
        >>> import jax, ensemblenn as enn
        >>> enn.resolve_mesh() is enn.default_mesh()
        True
        >>> mine = jax.make_mesh((2,), ("walkers",), devices=jax.devices()[:2])
        >>> enn.resolve_mesh(mine, "walkers") is mine
        True
    """
    if mesh is None:
        mesh = _context_mesh() or default_mesh(axis)
    if not hasattr(mesh, "axis_names"):
        raise MeshTypeError(
            f"mesh must be a jax.sharding.Mesh, got {mesh!r} ({type(mesh).__name__}).\n  fix: "
            "mesh=jax.make_mesh((jax.device_count(),), ('chains',)), or None for the default."
        )
    if not isinstance(axis, str) or axis not in mesh.axis_names:
        raise MeshError(
            f"The mesh has no axis named {axis!r}; its axes are {tuple(mesh.axis_names)} with "
            f"sizes {tuple(mesh.axis_sizes)}.\n  fix: pass axis=<one of those names> to "
            f"ensemble_map/partition, or build the mesh with that name, e.g. "
            f"jax.make_mesh((n,), ({axis!r},))."
        )
    return mesh


def mesh_platform(mesh: Any = None, axis: str = "chains") -> str:
    """The platform (`"cpu"`, `"gpu"`, `"tpu"`, ...) of the devices an ensemble runs on.

    Inside `jax.jit` only the abstract mesh is visible, which has no devices: the default
    backend's platform then stands for it.

    Example:
        >>> import ensemblenn as enn
        >>> enn.mesh_platform()
        'cpu'
    """
    mesh = resolve_mesh(mesh, axis)
    devices = getattr(mesh, "devices", None)
    if devices is None or getattr(devices, "size", 0) == 0:
        return jax.default_backend()
    platform = devices.flat[0].platform
    return "gpu" if platform in ("cuda", "rocm") else platform


def axis_size(mesh: Any, axis: str) -> int:
    return dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))[axis]


# Placed copies of broadcast arrays, by the identity of the (immutable) source array, for
# as long as the source lives: calling an ensemble_map again with the same data (a target,
# captured observations) then does not copy it to every device again.
_PLACED: dict[int, tuple[weakref.ref, Any, NamedSharding]] = {}


def place(x: Any, mesh: Any, spec: P, *, reuse: bool = False) -> Any:
    """`x` laid out as `NamedSharding(mesh, spec)`: numpy, uncommitted, single-device
    or differently sharded inputs all end up where `shard_map` needs them. The input
    itself is never modified. With `reuse`, a `jax.Array` placed before is not copied
    again while it is alive."""
    sharding = NamedSharding(mesh, spec)
    if not isinstance(x, jax.core.Tracer):
        if _laid_out_as(x, sharding):
            return x
        if reuse and isinstance(x, jax.Array):
            hit = _PLACED.get(id(x))
            if hit is not None and hit[0]() is x and hit[2] == sharding:
                return hit[1]
            placed = _put(x, sharding)
            if isinstance(placed, jax.core.Tracer):
                return placed  # placed inside a trace (jit, eval_shape): not reusable
            try:
                ref = weakref.ref(x, lambda _, key=id(x): _PLACED.pop(key, None))
            except TypeError:
                return placed
            _PLACED[id(x)] = (ref, placed, sharding)
            return placed
    return _put(x, sharding)


def _laid_out_as(x: Any, sharding: NamedSharding) -> bool:
    # Equal, or the same layout spelled differently: shard_map returns outputs as
    # `P(axis, None)` where they are placed as `P(axis)` (a dispatch per leaf per call on
    # an Explicit mesh), and on a one-device Auto mesh as `P()`. On an Explicit mesh the
    # spec is part of the array's type, which `shard_map` checks: only trailing `None`s
    # may differ there.
    have = getattr(x, "sharding", None)
    if have == sharding:
        return True
    if not (
        isinstance(x, jax.Array)
        and isinstance(have, NamedSharding)
        and have.mesh == sharding.mesh
        and have.memory_kind == sharding.memory_kind
    ):
        return False
    if AxisType.Explicit in tuple(getattr(sharding.mesh, "axis_types", ())):
        pad = lambda spec: tuple(spec) + (None,) * (x.ndim - len(spec))  # noqa: E731
        return pad(have.spec) == pad(sharding.spec)
    return have.is_equivalent_to(sharding, x.ndim)


def _put(x: Any, sharding: NamedSharding) -> Any:
    if not isinstance(x, jax.core.Tracer) and not sharding.is_fully_addressable:
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            # Across processes device_put refuses key arrays; their raw data it places.
            data = _put(jax.random.key_data(x), sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        if isinstance(x, np.ndarray | np.generic) or (
            isinstance(x, jax.Array) and x.is_fully_addressable
        ):
            # Data every process holds whole: each builds its own shards from it, with no
            # communication (JAX 0.12.1's device_put first checks that the copies agree with
            # a cross-process all-gather: one collective per placed leaf).
            host = np.asarray(x)
            host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype), copy=False)
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.device_put(x, sharding)
