"""One progress bar for the whole run, updated by the host between compiled calls and,
through the adaptation, by its ticks.

It covers every phase: initialising, adapting (its steps counted as the adaptation's
program runs, see `samplers.adaptation.tick`), compiling the chunk program, warmup and
sampling, each shown as `phase=...`, and ONE rate (steps/s over the executed chunks only,
so compilation does not skew it). The bar has a fixed width, so the fields beside it never
squeeze it; the time each phase took is added at the end. Disabled, every method is a
no-op that neither blocks nor prints; it is never used inside a trace.
"""

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax

_FORMAT = "{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
_TICKS = 100  # ticks over an adaptation: a host callback per 1 % of its steps


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
        self._lock = threading.Lock()  # ticks arrive on the runtime's threads

    @property
    def enabled(self) -> bool:
        return self._enabled

    def _open(self, initial: int = 0) -> None:
        # Opened at the first thing to show, so that a resumed run starts at its step.
        if self.bar is None and self._enabled:
            from tqdm.auto import tqdm

            # mininterval=0: the bar moves between chunks only (a few times a run), and each
            # of those frames must show, whatever the machine's load.
            self.bar = tqdm(total=self._total, initial=initial, unit="step", desc="ensemble",
                            leave=True, file=self._file, bar_format=_FORMAT,
                            mininterval=0)  # fmt: skip

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

    @contextlib.contextmanager
    def adapting(self, steps: int | None) -> Iterator[tuple[int | None, list]]:
        """The adaptation's phase: `steps` more on the bar, counted as its ticks arrive.

        Yields `(every, produced)`: the tick interval to compile the adaptation with
        (None: no bar, or an adaptation that does not say its length, which then moves
        the bar at its end only) and the list of `phase`.
        """
        if not self._enabled or not steps:
            with self.phase("adapting") as produced:
                yield None, produced
            return
        self._open()
        with self._lock:
            self.bar.total += steps
        start = self.bar.n
        self._current = "adapting (compiling)..."

        def reached(step: int) -> None:
            with self._lock:
                self._current = "adapting..."
                done = start + min(step + 1, steps)
                if done > self.bar.n:
                    self._show(pending=done - self.bar.n)
                    self.bar.update(done - self.bar.n)

        from ..adaptation import listening

        with listening(reached), self.phase("adapting") as produced:
            self._current = "adapting (compiling)..."
            self._show()
            yield max(1, steps // _TICKS), produced
        with self._lock:  # an adaptation that stopped early ends here too
            if self.bar.n < start + steps:
                self.bar.update(start + steps - self.bar.n)

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
            fields = {"phase": self._current} if self._current else {}
            if self._steps:
                fields["rate"] = f"{self._steps / max(self._seconds, 1e-9):.1f} steps/s"
            if self._acceptance is not None:
                fields["acc"] = f"{self._acceptance:.3f}"
            for name, seconds in self.timings.items():  # what each phase took, at the end
                fields[name] = f"{seconds:.1f}s"
            self.bar.set_postfix(fields, refresh=True)
            self.bar.close()
