"""A progress bar over SMC's stages: how far the temperature has come from 0 to 1.

The temperature is what an adaptive schedule does not know in advance the stages of, so
the bar measures it (per mille), with the stage, its ESS, the moves' acceptance and the
running log Z beside it. Disabled, it is a no-op.
"""

import sys
from typing import Any

_UNITS = 1000  # the bar's total: the temperature in thousandths


class StageProgress:
    """A tqdm bar over the temperature; a no-op if not `enabled`.

    Example:
        >>> import io
        >>> from samplers.smc._progress import StageProgress
        >>> out = io.StringIO()
        >>> bar = StageProgress(enabled=True, file=out)
        >>> bar.stage(1, 0.25, ess=512.0, acceptance=0.6, log_evidence=-3.2)
        >>> bar.close()
        >>> "stage=1" in out.getvalue() and "250/1000" in out.getvalue()
        True
    """

    def __init__(self, enabled: bool, file: Any = None):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=_UNITS, desc="SMC temperature", file=file or sys.stderr, leave=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} "
                "[{elapsed}{postfix}]",
            )  # fmt: skip

    def stage(
        self, stage: int, beta: float, *, ess: float, acceptance: float, log_evidence: float
    ) -> None:
        if self.bar is None:
            return
        self.bar.update(int(round(beta * _UNITS)) - self.bar.n)
        self.bar.set_postfix_str(
            f"stage={stage}, ESS={ess:.0f}, acceptance={acceptance:.2f}, log Z={log_evidence:.3f}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
