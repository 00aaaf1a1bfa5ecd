"""One progress bar for the whole run, updated by the host between compiled calls.

It covers every phase: initialising, adapting, compiling the chunk program, warmup and
sampling, each shown as `phase=...` with the time the finished ones took, and ONE rate
(steps/s over the executed chunks only, so compilation does not skew it). Disabled, every
method is a no-op that neither blocks nor prints; it is never used inside a trace.
"""

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import jax

_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class Progress:
    """A tqdm bar over a run's steps, with its phases; a no-op if not `enabled`.

    Args:
        total: the run's steps (warmup + sampling).
        enabled: show the bar.
        file: the stream to write to (default: stderr), e.g. a `io.StringIO` in tests.

    Example:
        >>> import io
        >>> from samplers.driver._progress import Progress
        >>> out = io.StringIO()
        >>> bar = Progress(10, enabled=True, file=out)
        >>> with bar.phase("compiling"):
        ...     pass
        >>> bar.advance(10, 0.5, 2.0, "sampling")
        >>> bar.close()
        >>> last = out.getvalue().replace("\\r", "\\n").strip().splitlines()[-1]
        >>> "10/10" in last and "phase=sampling" in last and "rate=5.0 steps/s" in last
        True
    """

    def __init__(self, total: int, *, enabled: bool, file: Any = None):
        self.bar = None
        self.timings: dict[str, float] = {}
        self._enabled, self._total, self._file = enabled, total, file
        self._current = ""
        self._steps = 0
        self._seconds = 0.0
        self._acceptance: float | None = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    def _open(self, initial: int = 0) -> None:
        # Opened at the first thing to show, so that a resumed run starts at its step.
        if self.bar is None and self._enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self._total, initial=initial, unit="step", desc="ensemble",
                            leave=True, file=self._file, bar_format=_FORMAT)  # fmt: skip

    def _show(self, pending: int = 0) -> None:
        """Set the postfix; with `pending` steps about to be added, let `update` draw it."""
        self._open()
        if self.bar is None:
            return
        fields = {"phase": self._current}
        if self._steps:
            rate = self._steps / max(self._seconds, 1e-9)
            fields["rate"] = f"{rate:.1f} steps/s"
            left = self.bar.total - self.bar.n - pending
            if left > 0:
                fields["eta"] = f"{left / max(rate, 1e-9):.0f}s"
        if self._acceptance is not None:
            fields["acc"] = f"{self._acceptance:.3f}"
        for name, seconds in self.timings.items():
            fields[name] = f"{seconds:.1f}s"
        self.bar.set_postfix(fields, refresh=not pending)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[list]:
        """Show `name` while the block runs, then record how long it took.

        The block may append the arrays it produced to the yielded list: they are waited
        for before the time is taken (JAX dispatches asynchronously).
        """
        produced: list = []
        if not self._enabled:
            yield produced
            return
        self._current = name + "..."
        self._show()
        tick = time.perf_counter()
        yield produced
        jax.block_until_ready(produced)
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - tick
        self._show()

    def start_at(self, step: int) -> None:
        """Continue from `step` (a resumed run), without counting those steps in the rate."""
        if not self._enabled:
            return
        self._open(initial=step)
        self._show()

    def advance(self, steps: int, acceptance: Any, seconds: float, phase: str) -> None:
        """`steps` more steps, run in `seconds` (measured after the results were ready)."""
        if not self._enabled:
            return
        self._steps += steps
        self._seconds += seconds
        self._acceptance = float(acceptance)
        self._current = phase
        self._show(pending=steps)
        self.bar.update(steps)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
