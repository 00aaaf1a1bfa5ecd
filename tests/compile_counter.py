"""Count what JAX compiles, through its public monitoring events (no private caches)."""

import contextlib
from collections.abc import Iterator

import jax

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


class Compiles:
    """The programs JAX compiled while a `counting()` block ran, by function name."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __len__(self) -> int:
        return len(self.names)

    def listen(self, event: str, duration: float, **kwargs: object) -> None:
        if event == BACKEND_COMPILE:
            self.names.append(str(kwargs.get("fun_name", "?")))


@contextlib.contextmanager
def counting() -> Iterator[Compiles]:
    """`with counting() as compiles: ...`, then `len(compiles)` programs were compiled."""
    compiles = Compiles()
    jax.monitoring.register_event_duration_secs_listener(compiles.listen)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(compiles.listen)
