"""WindowAdaptation's schedule: Stan's warmup windows and the static flags of every step."""

import numpy as np

__all__ = ["Phases", "phases", "window_schedule"]


def window_schedule(
    num_steps: int, initial_buffer: int, first_window: int, final_buffer: int
) -> tuple[int, int, list[int]]:
    """Stan's warmup windows: `(initial_buffer, final_buffer, ends of the slow windows)`.

    Steps `[0, initial_buffer)` tune the step size only; slow windows follow, each twice
    as long as the one before (the first `first_window` steps), the last one stretched to
    end at `num_steps - final_buffer`; the final buffer tunes the step size for the last
    metric. When the three do not fit in `num_steps`, they become 15 %, 75 % and 10 % of
    it (Stan's rule); below 20 steps there is no metric window at all.

    Example:
        >>> from samplers.adaptation import window_schedule
        >>> window_schedule(500, 75, 25, 50)
        (75, 50, [100, 150, 250, 450])
        >>> window_schedule(100, 75, 25, 50)
        (15, 10, [90])
        >>> window_schedule(10, 75, 25, 50)
        (10, 0, [])
    """
    if num_steps < 20:
        return num_steps, 0, []
    if initial_buffer + first_window + final_buffer > num_steps:
        initial_buffer = int(0.15 * num_steps)
        final_buffer = int(0.1 * num_steps)
        first_window = num_steps - initial_buffer - final_buffer
    slow_end = num_steps - final_buffer
    ends, start, size = [], initial_buffer, first_window
    while start < slow_end:
        end = start + size
        if end + 2 * size > slow_end:  # the next window would not fit: stretch this one
            end = slow_end
        ends.append(end)
        start, size = end, 2 * size
    return initial_buffer, final_buffer, ends


class Phases:
    """Static per-step flags of a schedule (numpy arrays of `num_steps`), and where the
    last step-size stage starts.

    Attributes:
        in_window: the step's draw enters the window sums.
        window_start: the window sums are emptied before the step.
        window_end: the metric is re-estimated after the step.
        reinit: the step-size heuristic runs before the step.
        last_stage: the first step of the final buffer (0 without a metric: the whole run).
    """

    def __init__(self, num_steps: int, initial: int, ends: list[int]):
        steps = np.arange(num_steps)
        self.in_window = (steps >= initial) & (steps < (ends[-1] if ends else 0))
        self.window_end = np.isin(steps + 1, ends)
        self.window_start = self.in_window & ((steps == initial) | np.isin(steps, ends))
        self.reinit = (steps == 0) | np.isin(steps, ends)
        self.last_stage = ends[-1] if ends else 0


def phases(
    num_steps: int, initial_buffer: int, first_window: int, final_buffer: int, has_metric: bool
) -> Phases:
    """The flags of `window_schedule(...)`; without a metric to estimate, one stage.

    Example:
        >>> from samplers.adaptation._window_schedule import phases
        >>> p = phases(100, 75, 25, 50, has_metric=True)   # 15 / 75 / 10 %: window 15-89
        >>> int(p.in_window.sum()), p.window_end.nonzero()[0].tolist(), p.last_stage
        (75, [89], 90)
    """
    initial, _, ends = window_schedule(num_steps, initial_buffer, first_window, final_buffer)
    return Phases(num_steps, initial, ends if has_metric else [])
