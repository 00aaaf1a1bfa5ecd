"""b² during adaptation: the ensemble's second-moment bias after every adaptation step.

With `track_bias=True` and a reference, `samplers.run` hands each adaptation that supports
it (`Adaptation.with_bias_monitor`) a `BiasMonitor`. The adaptation records one row per
step, `(b² max, b² mean, gradients per chain so far)`, in a buffer of static capacity
(unused rows NaN) that its info carries as `bias_history`; the driver keeps the used rows
in `Result.adaptation_bias`. Recording only reads the chains: the adaptation's arithmetic
is unchanged.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

import ensemblenn as enn

from .. import diagnostics as diag
from ..kernels import Logdensity


class BiasMonitor(eqx.Module):
    """The reference second moments that the adaptation's b² rows are measured against.

    `row` and `record` use `enn.chain_mean`, so, written for ONE chain, they must be called
    by every chain of the ensemble at the same step (inside the adaptation's loop).

    Attributes:
        second_moment: the reference `E[x²]` of the target's observable (flat).
        second_moment_var: the reference `Var[x²]`, the scale of b².

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> from samplers.adaptation import BiasMonitor
        >>> monitor = BiasMonitor(jnp.ones(2), 2 * jnp.ones(2))   # a standard normal
        >>> rows = enn.ensemble_map(lambda x: monitor.row(None, x, jnp.int32(3)),
        ...                         in_roles=enn.PER_CHAIN, out_roles=enn.BROADCAST)
        >>> rows(jnp.array([[1.0, 2.0], [1.0, 0.0]] * 2)).tolist()   # E[x²] = (1, 2)
        [0.5, 0.25, 3.0]
        >>> BiasMonitor.empty(5).shape   # a buffer of 5 rows for `record`, all NaN
        (5, 3)
    """

    second_moment: Float[Array, " dim"] = enn.broadcast(converter=jnp.asarray)
    second_moment_var: Float[Array, " dim"] = enn.broadcast(converter=jnp.asarray)

    @classmethod
    def of(cls, reference: Any) -> "BiasMonitor":
        """The monitor of a `samplers.targets.Moments` reference."""
        return cls(reference.second_moment, reference.second_moment_var)

    def row(
        self, logdensity: Logdensity | None, position: Float[Array, " dim"], grads: ArrayLike
    ) -> Float[Array, "3"]:
        """`(b² max, b² mean, mean over chains of grads)` for the ensemble at `position`
        (this chain's), of the target's `observable` when `logdensity` has one."""
        observe = getattr(logdensity, "observable", None)
        observed = position if observe is None else observe(position)
        b2max, b2mean = diag.bias_squared(
            enn.chain_mean(observed**2), self.second_moment, self.second_moment_var
        )
        per_chain = enn.chain_mean(jnp.asarray(grads).astype(jnp.float32))
        return jnp.stack([b2max, b2mean, per_chain]).astype(jnp.float32)

    def record(
        self,
        history: Float[Array, "capacity 3"],
        t: ArrayLike,
        logdensity: Logdensity | None,
        position: Float[Array, " dim"],
        grads: ArrayLike,
    ) -> Float[Array, "capacity 3"]:
        """`history` with row `t` set to `row(logdensity, position, grads)`."""
        return history.at[t].set(self.row(logdensity, position, grads))

    @staticmethod
    def empty(capacity: int) -> Float[Array, "capacity 3"]:
        """A history buffer for `record`: `capacity` rows (the adaptation's static
        maximum number of steps), all NaN, i.e. unused."""
        return jnp.full((capacity, 3), jnp.nan, jnp.float32)

    @staticmethod
    def used_rows(history: Any) -> Any:
        """The rows of a history buffer that a step filled (finite gradient count), in order,
        as a host array; `history` itself when it is traced (under `jit`); None when it is
        None or not such a buffer (a user adaptation's own `bias_history`).

        Example:
            >>> import jax.numpy as jnp
            >>> from samplers.adaptation import BiasMonitor
            >>> h = BiasMonitor.empty(3).at[1].set(jnp.array([0.5, 0.25, 4.0]))
            >>> BiasMonitor.used_rows(h).tolist()
            [[0.5, 0.25, 4.0]]
        """
        if history is None or np.ndim(history) != 2 or np.shape(history)[1] != 3:
            return None
        if isinstance(history, jax.core.Tracer):
            return history
        if isinstance(history, jax.Array) and not history.is_fully_addressable:
            history = history.addressable_shards[0].data  # replicated (broadcast) rows
        rows = np.asarray(history)
        return jnp.asarray(rows[np.isfinite(rows[:, 2])])


def attach(adaptation: Any, monitor: BiasMonitor) -> Any:
    """`adaptation` (a built-in with a `bias_monitor` field) with `monitor` in that field."""
    return eqx.tree_at(lambda a: a.bias_monitor, adaptation, monitor, is_leaf=lambda x: x is None)


def monitor_field() -> Any:
    """The `bias_monitor` field of the adaptations that record b²: None unless the driver
    attaches one; keyword-only (subclasses keep their positional fields) and not part of
    a checkpoint's fingerprint (it is not a setting).

    Example:
        An adaptation of your own that records b² declares the field like this:

        >>> import equinox as eqx
        >>> from samplers.adaptation import BiasMonitor, monitor_field
        >>> class MyTuning(eqx.Module):
        ...     num_steps: int
        ...     bias_monitor: BiasMonitor | None = monitor_field()
        >>> MyTuning(100).bias_monitor is None
        True
    """
    return eqx.field(default=None, kw_only=True, metadata={"fingerprint": False})
