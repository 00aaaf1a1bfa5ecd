"""What `samplers.run` returns."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

import ensemblenn as enn

from ._moments import ChainMoments
from ._verdict import Verdict, verdict_of


class Diagnostics(eqx.Module):
    """Ensemble diagnostics, computed on device from every chain's moments.

    Attributes:
        mean, sd, second_moment: ensemble estimates per dimension.
        rhat: split R-hat per dimension (from per-half moments).
        nested_rhat: nested R-hat per dimension when superchains were requested.
        ess: many-chain effective sample size per dimension.
        bias_squared_max, bias_squared_mean: b² of the second moments against the
            reference (None without one).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> result = samplers.run(samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(),
        ...                       jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=20,
        ...                       progress=False)
        >>> d = result.diagnostics
        >>> d.mean.shape, d.rhat.shape, d.ess.shape, d.bias_squared_max is None  # no reference
        ((2,), (2,), (2,), True)
    """

    mean: Float[Array, " dim"] = enn.broadcast()
    sd: Float[Array, " dim"] = enn.broadcast()
    second_moment: Float[Array, " dim"] = enn.broadcast()
    rhat: Float[Array, " dim"] = enn.broadcast()
    nested_rhat: Float[Array, " dim"] | None = enn.broadcast()
    ess: Float[Array, " dim"] = enn.broadcast()
    bias_squared_max: Float[Array, ""] | None = enn.broadcast()
    bias_squared_mean: Float[Array, ""] | None = enn.broadcast()


class Result(eqx.Module):
    """The outcome of `samplers.run`.

    Attributes:
        state: the final state of every chain (leaves stacked `(num_chains, ...)`).
        sampler: the sampler after adaptation (the one the sampling steps used).
        moments: every chain's streaming moments over the sampling steps.
        diagnostics: `Diagnostics` of the ensemble.
        acceptance_rate: mean acceptance per chain over warmup and sampling.
        num_divergent: divergent transitions per chain.
        num_grads: gradient evaluations per chain (excluding adaptation).
        trace: `(num_chains, num_draws, dim)` thinned draws if `thin` was given.
        bias_history: `(num_steps, 2)` ensemble b² (max, mean) per step if tracked.
        adaptation_info: whatever the adaptation reported.
        superchain_size: the run's superchain size (nested R-hat), or None.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> result = samplers.run(samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(),
        ...                       jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=20,
        ...                       thin=5, progress=False)
        >>> result.num_chains, result.state.position.shape, result.trace.shape
        (8, (8, 2), (8, 4, 2))
        >>> result.num_grads.tolist()   # a random walk uses no gradients
        [0, 0, 0, 0, 0, 0, 0, 0]
    """

    state: Any = enn.per_chain()
    sampler: Any
    moments: ChainMoments = enn.per_chain()
    diagnostics: Diagnostics
    acceptance_rate: Float[Array, " chains"] = enn.per_chain()
    num_divergent: Int[Array, " chains"] = enn.per_chain()
    num_grads: Int[Array, " chains"] = enn.per_chain()
    trace: Float[Array, "chains draws dim"] | None = enn.per_chain()
    bias_history: Float[Array, "steps 2"] | None = enn.broadcast()
    adaptation_info: Any = None
    num_steps: int = eqx.field(static=True, default=0)
    num_warmup: int = eqx.field(static=True, default=0)
    superchain_size: int | None = eqx.field(static=True, default=None)

    @property
    def num_chains(self) -> int:
        return int(self.acceptance_rate.shape[0])

    @property
    def verdict(self) -> "Verdict":
        """Whether the run can be trusted, with the failed criteria (`.converged`,
        `.reasons`); the rule is documented in `samplers.driver._verdict`."""
        return verdict_of(self)

    @property
    def converged(self) -> bool:
        """`self.verdict.converged`: max R-hat < 1.01, min ESS >= 400, no divergences and a
        sane acceptance (see `verdict`)."""
        return self.verdict.converged

    def summary(self, max_rows: int = 10, *, print_it: bool = True) -> str:
        """The verdict line (see `verdict`), then a compact table: mean, sd, R-hat and ESS per
        dimension (truncated for large d), with the ensemble's acceptance, divergences and
        b² when a reference was given."""
        d = self.diagnostics
        cols = {
            "mean": np.asarray(d.mean),
            "sd": np.asarray(d.sd),
            "rhat": np.asarray(d.rhat),
            "ess": np.asarray(d.ess),
        }
        if d.nested_rhat is not None:
            cols["nested_rhat"] = np.asarray(d.nested_rhat)
        dim = cols["mean"].shape[0]
        rows = list(range(dim))
        if dim > max_rows:
            half = max_rows // 2
            rows = rows[:half] + [-1] + rows[dim - half :]
        devices = _device_count(self.acceptance_rate)
        adapted = getattr(self.adaptation_info, "num_grads", None)
        adapting = "" if adapted is None else f" + {float(np.mean(adapted)):.0f} adapting"
        lines = [
            *self.verdict.lines(),
            f"{self.num_chains} chains on {devices} device(s), {self.num_warmup} warmup + "
            f"{self.num_steps} steps, {float(jnp.mean(self.num_grads)):.0f} grads/chain"
            f"{adapting}",
            f"acceptance {float(jnp.mean(self.acceptance_rate)):.3f}, divergent transitions "
            f"{int(jnp.sum(self.num_divergent))}, max R-hat {float(np.nanmax(cols['rhat'])):.4f}, "
            f"min ESS {float(np.nanmin(cols['ess'])):.0f}",
        ]
        if d.bias_squared_max is not None:
            lines.append(
                f"bias^2 of E[x^2]: max {float(d.bias_squared_max):.2e}, "
                f"mean {float(d.bias_squared_mean):.2e}"
            )
        header = f"{'dim':>6} " + " ".join(f"{name:>11}" for name in cols)
        lines += [header, "-" * len(header)]
        for r in rows:
            if r == -1:
                lines.append(f"{'...':>6}")
                continue
            lines.append(f"{r:>6} " + " ".join(f"{cols[n][r]:>11.4g}" for n in cols))
        text = "\n".join(lines)
        if print_it and jax.process_index() == 0:  # several processes: print once
            print(text)
        return text

    def to_arviz(self, *, var_name: str = "x", superchain_size: int | None = None) -> Any:
        """The trace as an `arviz.InferenceData` (needs `thin=` in `samplers.run`, and
        ArviZ); see `samplers.arviz.to_arviz` for the groups and coordinates."""
        from ..arviz import to_arviz

        return to_arviz(self, var_name=var_name, superchain_size=superchain_size)


def _device_count(x: Any) -> int:
    sharding = getattr(x, "sharding", None)
    return len(sharding.device_set) if isinstance(x, jax.Array) and sharding else 1
