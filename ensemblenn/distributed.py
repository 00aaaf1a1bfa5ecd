"""Ensembles that span several processes: joining the runtime, placement, gathering.

Every process runs the same script. `initialize` joins them into one JAX runtime, after
which `jax.devices()` lists every process's devices, the default mesh spans them all, and
`ensemble_map` (so `samplers.run`) shards the chains over all of them. A mesh over them
holds *global* arrays, of which each process addresses only its own shards. Host data that
is the same on every process is placed by `ensemble_map` by itself; this module covers the
rest: arrays assembled from each process's own block of chains (`global_array`), typed PRNG
keys (`place`, which `jax.device_put` refuses for other processes' devices), results read
back whole on every process (`gather`), and the two runtime checks a launcher needs
(`backends_started`, `pin_cpu_collectives`). `enn.chain_keys(key, n, mesh=...)` uses
`place` to give the keys as one global array. Progress bars and `Result.summary` print on
process 0 only (`is_main_process`).

Safety: the coordinator listens on `127.0.0.1` unless told otherwise (never on every
interface), and when it is on the loopback so are the CPU collectives (gloo).

With one process every function here is the plain single-process operation.

Example (two processes with two CPU devices each form one 4-device mesh; run the same
file as `python job.py 0 PORT` and `python job.py 1 PORT`, with PORT from `free_port()`):

    import sys
    import ensemblenn as enn
    enn.distributed.initialize(num_processes=2, process_id=int(sys.argv[1]),
                               port=int(sys.argv[2]), local_device_count=2)  # before jax work
    import jax, numpy as np, samplers
    result = samplers.run(samplers.MALA(step_size=0.5), samplers.targets.Banana(),
                          np.zeros((8, 2)), key=jax.random.key(0), num_steps=100)
    positions = enn.distributed.gather(result.state.position)  # (8, 2) numpy, every process
    result.summary()                                            # printed by process 0 only
    enn.distributed.shutdown()

On one process:

    >>> import numpy as np, jax, ensemblenn as enn
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = enn.resolve_mesh()
    >>> keys = enn.distributed.place(jax.random.split(jax.random.key(0), 4),
    ...                              NamedSharding(mesh, P("chains")))
    >>> keys.shape, enn.distributed.global_array(np.zeros((4, 2))).shape
    ((4,), (4, 2))
"""

import ipaddress
import socket
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array

from . import _jax_private
from ._errors import EnsembleError
from ._mesh import resolve_mesh

__all__ = [
    "backends_started",
    "free_port",
    "gather",
    "global_array",
    "initialize",
    "is_main_process",
    "pin_cpu_collectives",
    "place",
    "shutdown",
]

LOOPBACK = "127.0.0.1"


def place(x: Any, sharding: NamedSharding) -> Any:
    """`jax.device_put(x, sharding)`, typed PRNG keys included, for any process count.

    `x` is host data (or an array) that is the same on every process. `jax.device_put`
    refuses typed key arrays for shardings with other processes' devices; their key data
    it accepts, so keys are placed as data and re-wrapped with the same implementation.

    Example:
        >>> import jax, ensemblenn as enn
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> keys = jax.random.split(jax.random.key(0), 4)
        >>> placed = enn.distributed.place(keys, NamedSharding(enn.resolve_mesh(), P("chains")))
        >>> bool((jax.random.key_data(placed) == jax.random.key_data(keys)).all())
        True
    """
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = jax.device_put(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return jax.device_put(x, sharding)


def global_array(local: Any, mesh: Any = None, axis: str = "chains") -> Array:
    """One global per-chain array from each process's own block of chains.

    Process `p` passes the chains its devices hold, in process order; the result has every
    process's chains along the leading axis, sharded over `axis` of `mesh` (resolved as
    `enn.resolve_mesh` does). With one process it is `local`, placed.

    Raises:
        enn.MeshError: the mesh has no axis named `axis`.

    Example:
        >>> import numpy as np, ensemblenn as enn
        >>> enn.distributed.global_array(np.zeros((8, 3), np.float32)).shape
        (8, 3)
    """
    sharding = NamedSharding(resolve_mesh(mesh, axis), P(axis))
    return jax.make_array_from_process_local_data(sharding, np.asarray(local))


def backends_started() -> bool:
    """Whether JAX has created its backends in this process: after that,
    `jax.distributed.initialize` is too late.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> _ = jnp.zeros(1)   # any computation starts the backends
        >>> enn.distributed.backends_started()
        True
    """
    return _jax_private.backends_started()


def pin_cpu_collectives(host: str) -> bool:
    """Make the CPU backend's gloo collectives listen on `host` (e.g. the loopback) rather
    than on the address the machine's hostname resolves to, which may be a public one.

    Call it after choosing gloo (`jax_cpu_collectives_implementation`) and before the first
    computation. It relies on JAX internals, so it is guarded: if they moved, nothing is
    changed and False is returned (the collectives then listen on the default address).

    Example:
        A launcher pins before any computation (`enn.distributed.initialize` does):

        >>> import jax, ensemblenn as enn
        >>> def start(num_processes, process_id, port):
        ...     jax.config.update("jax_cpu_collectives_implementation", "gloo")
        ...     enn.distributed.pin_cpu_collectives("127.0.0.1")
        ...     jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
    """
    try:
        _jax_private.pin_cpu_collectives_to(host)
        return True
    except Exception:  # noqa: BLE001 - only the pinning is lost
        return False


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on `host` now (the OS picks it: bind to port 0).

    Example:
        >>> import ensemblenn as enn
        >>> 0 < enn.distributed.free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def initialize(
    num_processes: int,
    process_id: int,
    port: int,
    *,
    coordinator: str = LOOPBACK,
    bind_address: str | None = None,
    local_device_count: int | None = None,
    local_device_ids: list[int] | None = None,
    collectives: str = "gloo",
    timeout: int = 120,
) -> None:
    """Join this process to a multi-process JAX runtime (call it before any JAX work).

    A thin wrapper of `jax.distributed.initialize` with safe defaults: the coordinator (run
    by process 0) listens on `bind_address`, which defaults to the coordinator's own address
    (`127.0.0.1`), never on every interface, and CPU collectives use gloo, pinned to the
    loopback when the coordinator is on it.

    Args:
        num_processes: how many processes form the runtime.
        process_id: this process's index, `0 .. num_processes - 1` (0 runs the coordinator).
        port: the coordinator's TCP port (the same on every process; see `free_port`).
        coordinator: the coordinator's host address, as every process reaches it.
        bind_address: the address the coordinator listens on (default: `coordinator`).
        local_device_count: simulated CPU devices for this process (CPU only).
        local_device_ids: the accelerators this process uses (GPU/TPU), if not all.
        collectives: the CPU collectives implementation, `"gloo"` or `"mpi"`.
        timeout: seconds to wait for every process to join.

    Raises:
        enn.EnsembleError: bad arguments, or JAX has already started computing in this
            process (the runtime must be joined first).

    Example:
        The module docstring has a whole two-process script; arguments are checked first:

        >>> import ensemblenn as enn
        >>> try:   # process ids count from 0
        ...     enn.distributed.initialize(num_processes=2, process_id=2, port=12345)
        ... except enn.EnsembleError as err:
        ...     print(err)
        process_id must be below num_processes=2, got 2.
    """
    for name, value, low in (
        ("num_processes", num_processes, 1),
        ("process_id", process_id, 0),
        ("port", port, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise EnsembleError(f"{name} must be an int >= {low}, got {value!r}.")
    if process_id >= num_processes:
        raise EnsembleError(
            f"process_id must be below num_processes={num_processes}, got {process_id}."
        )
    if collectives not in ("gloo", "mpi"):
        raise EnsembleError(f"collectives must be 'gloo' or 'mpi', got {collectives!r}.")
    if backends_started():
        raise EnsembleError(
            "enn.distributed.initialize must run before any JAX computation in this "
            "process (a JAX backend has already started).\n  fix: call it at the top of the "
            "script, before creating arrays or running samplers."
        )
    if local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", int(local_device_count))
    jax.config.update("jax_cpu_collectives_implementation", collectives)
    if collectives == "gloo" and _is_loopback(coordinator):
        pin_cpu_collectives(LOOPBACK)
    bind = bind_address or coordinator
    jax.distributed.initialize(
        coordinator_address=f"{coordinator}:{port}",
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        coordinator_bind_address=f"{bind}:{port}",
        initialization_timeout=timeout,
    )


def shutdown() -> None:
    """Leave the multi-process runtime (at the end of the script, on every process).

    Example:
        >>> import ensemblenn as enn
        >>> enn.distributed.shutdown()   # a single process that never called initialize: no-op
        >>> enn.distributed.is_main_process()
        True
    """
    jax.distributed.shutdown()


def is_main_process() -> bool:
    """True on process 0, the one that prints and writes files.

    Example:
        >>> import ensemblenn as enn
        >>> enn.distributed.is_main_process()
        True
    """
    return jax.process_index() == 0


def gather(tree: Any) -> Any:
    """Every array leaf of `tree` as a numpy array holding the whole (global) array, on every
    process. Single-process arrays are simply copied to the host. With several processes this
    is collective: every process must call it with the same tree.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> enn.distributed.gather({"x": jnp.arange(4.0)})["x"].tolist()
        [0.0, 1.0, 2.0, 3.0]
    """
    leaves, treedef = jax.tree.flatten(tree)
    remote = [
        i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable
    ]
    if remote:
        from jax.experimental import multihost_utils

        fetched = multihost_utils.process_allgather([leaves[i] for i in remote], tiled=True)
        for i, x in zip(remote, fetched):
            leaves[i] = np.asarray(x)
    leaves = [np.asarray(x) if isinstance(x, jax.Array | np.ndarray) else x for x in leaves]
    return jax.tree.unflatten(treedef, leaves)
