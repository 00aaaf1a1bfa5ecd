"""Progress from inside an adaptation's compiled loop: `tick(step)`.

An adaptation is one compiled program, so the host sees nothing of it until it returns.
`samplers.run` shows its progress bar moving through the adaptation by compiling it with
ticks on: `tick(step)` then sends the step to the host every `every` steps (a
`jax.debug.callback` that reads values, so the sampled bits are unchanged). Without a bar
nothing is traced: the program is the one compiled without ticks. `every` is a static
argument of the program that turns ticks on, so each setting compiles (and is cached) as
its own program.
"""

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike

__all__ = ["listening", "tick", "ticking"]

_every: ContextVar[int | None] = ContextVar("ensemblenn_tick_every", default=None)
_lock = threading.Lock()
_listener: Callable[[int], None] | None = None


def tick(step: ArrayLike) -> None:
    """Report that the adaptation reached `step` (counted from 0 over all its phases).

    Call it once per step in an adaptation's loop body, with the loop's step counter (the
    same in every chain). It is a no-op unless `samplers.run` shows a progress bar.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.adaptation import tick
        >>> def body(t, x):
        ...     tick(t)   # nothing is traced here: no bar is listening
        ...     return x + 1.0
        >>> float(jax.lax.fori_loop(0, 5, body, jnp.float32(0.0)))
        5.0
    """
    every = _every.get()
    if every is None:
        return
    step = jnp.asarray(step, jnp.int32)
    jax.lax.cond(
        step % every == 0,
        lambda s: jax.debug.callback(_deliver, s),
        lambda s: None,
        step,
    )


@contextlib.contextmanager
def ticking(every: int | None) -> Iterator[None]:
    """Trace the `tick` calls made inside the block as host callbacks every `every` steps
    (None: off). `samplers.run` enters it while it traces an adaptation, with `every` a
    static argument of that program.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.adaptation import listening, tick, ticking
        >>> def loop(x):
        ...     with ticking(2):   # at trace time: every 2nd step reaches the host
        ...         return jax.lax.fori_loop(0, 6, lambda t, x: (tick(t), x + 1.0)[1], x)
        >>> seen = []
        >>> with listening(seen.append):
        ...     out = jax.block_until_ready(jax.jit(loop)(jnp.float32(0.0)))
        >>> sorted(seen), float(out)
        ([0, 2, 4], 6.0)
    """
    token = _every.set(every)
    try:
        yield
    finally:
        _every.reset(token)


@contextlib.contextmanager
def listening(listener: Callable[[int], None]) -> Iterator[None]:
    """Deliver the ticks that arrive while the block runs to `listener(step)`.

    Every device sends its own tick (the same step): the listener sees each step once per
    device, from a runtime thread, and should keep the highest.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.adaptation import listening, tick, ticking
        >>> def loop(x):
        ...     with ticking(2):   # at trace time: every 2nd step reaches the host
        ...         return jax.lax.fori_loop(0, 6, lambda t, x: (tick(t), x + 1.0)[1], x)
        >>> seen = []
        >>> with listening(seen.append):
        ...     out = jax.block_until_ready(jax.jit(loop)(jnp.float32(0.0)))
        >>> sorted(seen), float(out)
        ([0, 2, 4], 6.0)
    """
    global _listener
    with _lock:
        _listener = listener
    try:
        yield
    finally:
        with _lock:
            _listener = None


def _deliver(step: jax.Array) -> None:
    with _lock:
        listener = _listener
    if listener is not None:
        listener(int(step))
