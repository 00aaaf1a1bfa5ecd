"""What the command line samples: its targets, and each `--sampler` with its default tuning.

Every sampler is tuned by default, from the ensemble, during `--warmup` steps:

* rwm, mala, hmc, ghmc, nuts, adjusted-mclmc: `samplers.WindowAdaptation` (Stan-like
  windows: one step size shared by the ensemble, dual averaging of the ensemble-mean
  acceptance towards the kernel's target; the metric `--metric` says: by default dense
  up to 100 dimensions for mala and ghmc, else diagonal; for rwm a per-coordinate step
  size).
* mclmc: `samplers.MCLMCTuning`, LAPS's unadjusted phase (phases 0-1 of `samplers.LAPS`:
  step size driven by the energy error per dimension, `L` from the ensemble's spread, early
  stop once the ensemble's `E[x²]` stops drifting), after which the tuned, still
  unadjusted, MCLMC samples. It is the simplest honest default: no new tuning rule, the one
  LAPS already uses and tests, on the identity metric LAPS's phase 1 uses.
* laps: `samplers.LAPS` (which builds its own kernels).

hmc and adjusted-mclmc draw each transition's path length (1 to 19 steps, mean 10,
`jitter=True`): a fixed length resonates with a Gaussian's periods (adjusted-mclmc's
acceptance was not monotone in the step size and sampled at 0.99 on the 100-d Gaussian).

`--adaptation none` keeps the fixed, untuned kernels (step size 0.5) and runs `--warmup`
plain warmup steps instead.
"""

from typing import Any

from .. import targets
from ..adaptation import MCLMCTuning
from ..kernels import Sampler

TARGETS = {
    "gaussian": "zero-mean Gaussian, variances log-spaced from 1 to 100 (condition number 100)",
    "rotated-gaussian": "the same Gaussian, randomly rotated (a diagonal metric cannot fix it)",
    "banana": "2-d banana: x1 ~ N(0, 10²), x2 | x1 ~ N(0.03 (x1² - 100), 1)",
    "rosenbrock": "product of banana-shaped pairs x ~ N(1, 1), y | x ~ N(x², 0.1)",
    "funnel": "Neal's funnel: θ ~ N(0, 3²), z_i | θ ~ N(0, e^θ) (b² in Gaussianized units)",
    "bimodal": "two Gaussian modes 8 apart (weights 0.8 / 0.2): chains must hop to get b²",
    "logistic": "Bayesian logistic regression, 1000 synthetic points, N(0, I) prior",
}
SAMPLERS = ("rwm", "mala", "hmc", "ghmc", "nuts", "mclmc", "adjusted-mclmc", "laps")
# The WindowAdaptation metrics each --sampler can take (besides "auto" and "none"): rwm
# computes no gradients, rwm and adjusted-mclmc take no dense metric, and mclmc and laps
# are tuned by LAPS's own rules.
METRICS = {
    "rwm": ("diagonal",),
    "mala": ("diagonal", "dense", "gradient"),
    "hmc": ("diagonal", "dense", "gradient"),
    "ghmc": ("diagonal", "dense", "gradient"),
    "nuts": ("diagonal", "dense", "gradient"),
    "mclmc": (),
    "adjusted-mclmc": ("diagonal", "gradient"),
    "laps": (),
}
ONE_STEP = ("mala", "ghmc")  # one gradient step per transition: "auto" gives them dense
FIXED_DIM = {"banana": 2}  # targets whose dimension cannot be chosen


def make_target(name: str, dim: int | None) -> Any:
    """The target `name` at dimension `dim` (None: its default)."""
    if name in ("gaussian", "rotated-gaussian"):
        return targets.IllConditionedGaussian(
            dim=dim or 100, condition_number=100.0, rotated=name == "rotated-gaussian"
        )
    if name == "banana":
        return targets.Banana()
    if name == "rosenbrock":
        return targets.Rosenbrock(num_pairs=(dim or 36) // 2)
    if name == "funnel":
        return targets.NealsFunnel(dim=dim or 20)
    if name == "bimodal":
        return targets.BimodalGaussian(dim=dim or 10)
    return targets.LogisticRegression(num_features=dim or 10)


DENSE_UP_TO = 100  # --metric auto: dense up to this dimension (a Cholesky per step is cheap)


def metric_for(name: str, metric: str, dim: int) -> str | None:
    """What `--metric` means for `--sampler name` at dimension `dim`: the
    `WindowAdaptation` metric (`"dense"`, `"diagonal"`, `"gradient"` or None)."""
    if metric == "none":
        return None
    if metric == "auto":
        # mala and ghmc move one gradient step per transition, so a diagonal metric leaves
        # them slowed by every correlation; hmc's fixed 10-step path is hurt more by a 100-d
        # covariance estimate's noise than helped (measured: nested R-hat 1.029 dense vs
        # 1.003 diagonal on the 100-d gaussian), and nuts does well with either.
        return "dense" if name in ONE_STEP and dim <= DENSE_UP_TO else "diagonal"
    return metric  # one the sampler cannot take (METRICS): refused by check_arguments


def make_sampler(
    name: str, adapt: bool, warmup: int, metric: str = "auto", dim: int = 1
) -> tuple[Sampler | None, Any, str]:
    """`(sampler, adaptation, description)` for `--sampler name` (`metric`: `--metric`)."""
    import samplers

    if name == "laps":
        laps = samplers.LAPS(num_steps1=max(warmup, 1))
        return None, laps, f"LAPS (up to {warmup} unadjusted steps, then tuned adjusted MCLMC)"
    if name == "mclmc" and adapt:
        return None, MCLMCTuning(num_steps=max(warmup, 1)), (
            f"MCLMC (unadjusted), tuned by LAPS's phase 1 over up to {warmup} steps"
        )  # fmt: skip
    h = 0.5
    kernel = {
        "rwm": lambda: samplers.RandomWalk(step_size=h),
        "mala": lambda: samplers.MALA(step_size=h),
        "hmc": lambda: samplers.HMC(step_size=h, num_integration_steps=10, jitter=True),
        "ghmc": lambda: samplers.GHMC(step_size=h, damping=1.0),
        "nuts": lambda: samplers.NUTS(step_size=h),
        "mclmc": lambda: samplers.MCLMC(step_size=h, L=3.0),
        "adjusted-mclmc": lambda: samplers.AdjustedMCLMC(
            step_size=h, num_integration_steps=10, jitter=True
        ),
    }[name]()
    label = type(kernel).__name__
    if not adapt or warmup == 0:
        return kernel, None, f"{label} with the fixed step size {h} (no adaptation)"
    chosen = metric_for(name, metric, dim)
    adaptation = samplers.WindowAdaptation(num_steps=warmup, metric=chosen)
    what = "step size" if chosen is None else f"step size and {chosen} metric"
    if chosen == "diagonal" and name == "rwm":
        what = "step size and per-coordinate scales"
    return kernel, adaptation, f"{label}, {what} tuned by WindowAdaptation over {warmup} steps"
