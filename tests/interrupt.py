"""Stopping a run at a chosen point, through `samplers.run`'s public `on_chunk` seam."""

import os
from collections.abc import Callable
from pathlib import Path

import samplers

_RENAME = os.replace  # the real one, whatever a test has patched in since


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


def before_rename(action: Callable[[Path], None]) -> Callable:
    """A stand-in for `os.replace` (monkeypatch it in) that calls `action(temporary file)`
    before the rename that commits a checkpoint file: the moment a write can fail or the
    process be killed with the new bytes on disk but the old file still in place. Other
    renames pass through."""

    def replace(src: str | Path, dst: str | Path, *args: object, **kwargs: object) -> None:
        if ".tmp-" in Path(src).name:
            action(Path(src))
        _RENAME(src, dst, *args, **kwargs)

    return replace
