"""Stopping a run at a chosen point, through `samplers.run`'s public `on_chunk` seam."""

from collections.abc import Callable
from pathlib import Path

import samplers


class Interrupt(Exception):
    """A preemption, raised by the tests' `on_chunk` (not the user's Ctrl-C)."""


def after_save(
    folder: str | Path, step: int, error: type[BaseException] = Interrupt
) -> Callable[[int, int], None]:
    """An `on_chunk` that stops the run right after its checkpoint in `folder` has reached
    `step` (read with the public `samplers.checkpoint.inspect`)."""

    def on_chunk(done: int, total: int) -> None:
        if done >= step and samplers.checkpoint.inspect(folder)["step"] >= step:
            raise error

    return on_chunk
