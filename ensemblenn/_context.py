"""The ensemble a per-chain function is running in, for the collectives to consult."""

import contextlib
import contextvars
from collections.abc import Iterator
from typing import NamedTuple


class EnsembleFrame(NamedTuple):
    """What a per-chain body needs to know about its ensemble.

    `local_axis` is the `jax.vmap` axis over a device's chains, `mesh_axis` the
    `shard_map` axis over devices; chain `i` lives on device `i // num_local`.
    """

    local_axis: str
    mesh_axis: str
    num_chains: int
    num_local: int
    num_devices: int
    block_size: int | None = None
    inside_block: bool = False  # tracing `batch_invariant` code: no collectives here


_FRAMES: contextvars.ContextVar[tuple[EnsembleFrame, ...]] = contextvars.ContextVar(
    "ensemblenn_frames", default=()
)


def current_frame() -> EnsembleFrame | None:
    frames = _FRAMES.get()
    return frames[-1] if frames else None


@contextlib.contextmanager
def entered(frame: EnsembleFrame) -> Iterator[EnsembleFrame]:
    token = _FRAMES.set(_FRAMES.get() + (frame,))
    try:
        yield frame
    finally:
        _FRAMES.reset(token)
