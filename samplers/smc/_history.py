"""What the host keeps of an SMC run, stage by stage: the schedule, the evidence and the
genealogy terms of its standard error, ESS, acceptance, step sizes and moves. It is also
what a checkpoint saves (`state`) and a resumed run starts from (`restore`)."""

from typing import Any

import numpy as np

from ._schedule import ess_fraction, lineage_residuals, log_mean_exp


class History:
    """What the host keeps of each stage: the schedule, the evidence and its lineage
    terms (see `SMC`), ESS, acceptance and step size."""

    def __init__(self, n: int, step_size: float):
        self.n, self.step_size = n, step_size
        self.temperatures: list[float] = []
        self.increments: list[float] = []
        self.ess: list[float] = []
        self.acceptance: list[float] = []
        self.step_sizes: list[float] = []
        self.mutation_steps: list[int] = []
        self.correlations: list[float] = []
        self.eves = np.arange(n)  # each particle's ancestor in the initial population
        self.lineage = np.zeros(n)
        self.num_lineages = n
        self.num_nonfinite = 0
        self.ll_host: np.ndarray | None = None  # restored: the next weights' log likelihoods

    _LISTS = ("temperatures", "increments", "ess", "acceptance", "step_sizes",
              "mutation_steps", "correlations")  # fmt: skip

    def state(self, ll_host: np.ndarray) -> dict[str, Any]:
        """Everything to carry on from, as arrays (with the next weights' log
        likelihoods)."""
        lists = {f"log_{k}": np.asarray(getattr(self, k)) for k in self._LISTS}
        return lists | dict(
            log_eves=self.eves, log_lineage=self.lineage, log_step_size=self.step_size,
            log_num_lineages=self.num_lineages, log_num_nonfinite=self.num_nonfinite,
            ll_host=ll_host,
        )  # fmt: skip

    @classmethod
    def restore(cls, saved: dict[str, np.ndarray]) -> "History":
        log = cls(len(saved["log_eves"]), float(saved["log_step_size"]))
        for k in cls._LISTS:
            setattr(log, k, np.asarray(saved[f"log_{k}"]).tolist())
        log.eves, log.lineage = saved["log_eves"], saved["log_lineage"]
        log.num_lineages = int(saved["log_num_lineages"])
        log.num_nonfinite = int(saved["log_num_nonfinite"])
        log.ll_host = saved["ll_host"]
        return log

    def reweighted(self, beta: float, log_w: np.ndarray) -> None:
        self.temperatures.append(beta)
        self.increments.append(log_mean_exp(log_w))
        self.ess.append(ess_fraction(log_w) * self.n)
        self.step_sizes.append(self.step_size)
        self.lineage += lineage_residuals(log_w, self.eves)
        self.num_lineages = len(np.unique(self.eves))

    def moved(self, ancestor: np.ndarray, ll: np.ndarray, acceptance: np.ndarray) -> np.ndarray:
        """Records the moves; returns the log likelihoods the next weights use (NaN and
        +inf counted, then given weight zero)."""
        self.eves = self.eves[ancestor]
        self.acceptance.append(float(np.mean(acceptance)))
        bad = np.isnan(ll) | np.isposinf(ll)
        self.num_nonfinite += int(bad.sum())
        return np.where(bad, -np.inf, ll)
