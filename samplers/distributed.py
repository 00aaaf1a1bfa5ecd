"""Several processes as one ensemble: `samplers.run` across hosts (or processes on one host).

Every process runs the same script. `initialize` joins them into one JAX runtime, after which
`jax.devices()` lists every process's devices, the default mesh spans them all, and
`samplers.run` shards the chains over all of them. Inputs given as host data that is the
same on every process (numpy arrays, or arrays computed from the same key) are placed by
`ensemble_map` as they are; chains that only exist on their own process are assembled with
`global_array`. Results are global arrays: read them with `gather`, which gives every process
the whole ensemble as numpy. Progress bars and `Result.summary` print on process 0 only.

Safety: the coordinator listens on `127.0.0.1` unless told otherwise (never on every
interface), and when it is on the loopback so are the CPU collectives (gloo).

Example (two processes with two CPU devices each form one 4-device mesh; run the same
file as `python job.py 0 PORT` and `python job.py 1 PORT`, with PORT from `free_port()`):

    import sys
    import samplers.distributed as dist
    dist.initialize(num_processes=2, process_id=int(sys.argv[1]), port=int(sys.argv[2]),
                    local_device_count=2)          # before anything else touches jax
    import jax, numpy as np, samplers
    result = samplers.run(samplers.MALA(step_size=0.5), samplers.targets.Banana(),
                          np.zeros((8, 2)), key=jax.random.key(0), num_steps=100)
    positions = dist.gather(result.state.position)  # (8, 2) numpy on both processes
    result.summary()                                # printed by process 0 only
    dist.shutdown()
"""

import ipaddress
import socket
from typing import Any

import jax
import numpy as np
from jaxtyping import Array, PRNGKeyArray

import ensemblenn as enn

__all__ = [
    "chain_keys",
    "free_port",
    "gather",
    "global_array",
    "initialize",
    "is_main_process",
    "place",
    "shutdown",
]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on `host` now (the OS picks it: bind to port 0).

    Example:
        >>> import samplers.distributed as dist
        >>> 0 < dist.free_port() < 65536
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

        >>> import ensemblenn as enn, samplers.distributed as dist
        >>> try:   # process ids count from 0
        ...     dist.initialize(num_processes=2, process_id=2, port=dist.free_port())
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
            raise enn.EnsembleError(f"{name} must be an int >= {low}, got {value!r}.")
    if process_id >= num_processes:
        raise enn.EnsembleError(
            f"process_id must be below num_processes={num_processes}, got {process_id}."
        )
    if collectives not in ("gloo", "mpi"):
        raise enn.EnsembleError(f"collectives must be 'gloo' or 'mpi', got {collectives!r}.")
    if enn.distributed.backends_started():
        raise enn.EnsembleError(
            "samplers.distributed.initialize must run before any JAX computation in this "
            "process (a JAX backend has already started).\n  fix: call it at the top of the "
            "script, before creating arrays or running samplers."
        )
    if local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", int(local_device_count))
    jax.config.update("jax_cpu_collectives_implementation", collectives)
    if collectives == "gloo" and _is_loopback(coordinator):
        enn.distributed.pin_cpu_collectives(LOOPBACK)
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
        >>> import samplers.distributed as dist
        >>> dist.shutdown()   # a single process that never called initialize: no-op
        >>> dist.is_main_process()
        True
    """
    jax.distributed.shutdown()


def is_main_process() -> bool:
    """True on process 0, the one that prints and writes files.

    Example:
        >>> import samplers.distributed as dist
        >>> dist.is_main_process()
        True
    """
    return jax.process_index() == 0


def gather(tree: Any) -> Any:
    """Every array leaf of `tree` as a numpy array holding the whole (global) array, on every
    process. Single-process arrays are simply copied to the host. With several processes this
    is collective: every process must call it with the same tree.

    Example:
        >>> import jax.numpy as jnp, samplers.distributed as dist
        >>> dist.gather({"x": jnp.arange(4.0)})["x"].tolist()
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


def global_array(local: Any, mesh: Any = None, axis: str = "chains") -> Array:
    """One global per-chain array from each process's own block of chains:
    `enn.distributed.global_array`.

    Process `p` passes the chains it holds (its devices' share, in process order); the
    result has all of them along the leading axis, sharded over `axis`. Use it when chains
    are created per process (e.g. from process-local data); host data that is the same on
    every process needs nothing.

    Example:
        >>> import numpy as np, samplers.distributed as dist
        >>> dist.global_array(np.zeros((8, 3), np.float32)).shape   # one process: all 8
        (8, 3)
    """
    return enn.distributed.global_array(local, mesh, axis)


def chain_keys(
    key: PRNGKeyArray, num_chains: int, *, mesh: Any = None, axis: str = "chains"
) -> PRNGKeyArray:
    """`enn.chain_keys`, which gives a global array when several processes share the mesh.

    Example:
        >>> import jax, ensemblenn as enn, samplers.distributed as dist
        >>> keys = dist.chain_keys(jax.random.key(0), 8)
        >>> bool((jax.random.key_data(keys) ==
        ...       jax.random.key_data(enn.chain_keys(jax.random.key(0), 8))).all())
        True
    """
    return enn.chain_keys(key, num_chains, mesh=mesh, axis=axis)


def place(x: Any, sharding: Any) -> Any:
    """`jax.device_put(x, sharding)` for host data that is the same on every process, typed
    PRNG keys included: `enn.distributed.place`.

    Example:
        >>> import jax, ensemblenn as enn, samplers.distributed as dist
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> dist.place(jax.numpy.arange(4.0), NamedSharding(enn.resolve_mesh(), P())).shape
        (4,)
    """
    return enn.distributed.place(x, sharding)
