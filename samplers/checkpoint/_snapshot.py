"""`Snapshot`: what a run saves between two chunks."""

from typing import Any, NamedTuple

import jax.numpy as jnp
from jaxtyping import PRNGKeyArray


class Snapshot(NamedTuple):
    """What `samplers.run` saves, all of it as the run holds it between two chunks.

    Attributes:
        step: global steps done (warmup included); the next chunk starts here.
        sampler: the sampler the steps use (after adaptation).
        carry: the driver's per-chain carry: states, moments, acceptance and counters.
        adaptation_info: whatever the adaptation reported (None without adaptation).
        keys: the per-chain keys of the stepping phase.
        trace: the thinned draws so far, `(num_chains, num_draws, dim)`, or None.
        bias_history: the b² history so far, `(num_sampled, 2)`, or None.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.checkpoint import Snapshot
        >>> pieces = [jnp.zeros((4, 2, 3)), jnp.ones((4, 3, 3))]   # two chunks' draws
        >>> snap = Snapshot(step=50, sampler=None, carry=None, adaptation_info=None,
        ...                 keys=jax.random.split(jax.random.key(0), 4),
        ...                 trace=jnp.concatenate(pieces, axis=1), bias_history=None)
        >>> snap.trace.shape, len(snap.trace_list()), snap.bias_list()
        ((4, 5, 3), 1, [])
    """

    step: int
    sampler: Any
    carry: Any
    adaptation_info: Any
    keys: PRNGKeyArray
    trace: Any
    bias_history: Any

    @classmethod
    def of_run(
        cls,
        step: int,
        sampler: Any,
        carry: Any,
        adaptation_info: Any,
        keys: PRNGKeyArray,
        trace: list | None,
        bias_history: list | None,
    ) -> "Snapshot":
        """A snapshot from the driver's running values; `trace` and `bias_history` are the
        lists of per-chunk pieces it accumulates (None when it keeps none)."""
        position = carry.state.position
        if trace is not None:
            trace = (
                jnp.concatenate(trace, axis=1)
                if trace
                else jnp.zeros((position.shape[0], 0, position.shape[1]), position.dtype)
            )
        if bias_history is not None:
            bias_history = (
                jnp.concatenate(bias_history, axis=0)
                if bias_history
                else jnp.zeros((0, 2), jnp.float32)
            )
        return cls(step, sampler, carry, adaptation_info, keys, trace, bias_history)

    def trace_list(self) -> list:
        """The saved trace as the driver's list of pieces (empty if it has no draws)."""
        return [] if self.trace is None or self.trace.shape[1] == 0 else [self.trace]

    def bias_list(self) -> list:
        """The saved b² history as the driver's list of pieces."""
        return (
            []
            if self.bias_history is None or self.bias_history.shape[0] == 0
            else [self.bias_history]
        )
