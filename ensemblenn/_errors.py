"""The library's exception types.

Every error the library raises on bad input is an `EnsembleError` (a `ValueError`), so
`except ValueError` still catches it. Messages name the leaf path, shape and role, say
why it is wrong and how to fix it.
"""


class EnsembleError(ValueError):
    """Base class of every error ensemblenn raises about the user's input."""


class RoleError(EnsembleError):
    """A partition role is invalid, or is attached to something that cannot carry it."""


class ChainCountError(EnsembleError):
    """Per-chain leaves disagree on the number of chains, or it does not fit the mesh."""


class MeshError(EnsembleError):
    """The mesh or the named axis is unusable for an ensemble."""


class ClosureError(EnsembleError):
    """A function captures a `jax.Array` that cannot enter a `shard_map` body."""


class OutputRoleError(EnsembleError):
    """An output's declared role contradicts what the function computed."""


class CollectiveError(EnsembleError):
    """A cross-chain collective was called outside `ensemble_map`."""
