"""One progress bar for the whole ensemble, updated by the host between chunks."""

from typing import Any


class Progress:
    """A tqdm bar showing steps/s and the ensemble acceptance rate; a no-op if disabled."""

    def __init__(self, total: int, *, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="step", desc="ensemble", leave=True)

    def update(self, steps: int, acceptance: Any, seconds: float, phase: str) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix(
            phase=phase,
            acc=f"{float(acceptance):.3f}",
            rate=f"{steps / max(seconds, 1e-9):.1f} steps/s",
        )
        self.bar.update(steps)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
