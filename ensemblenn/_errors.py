"""The library's exception types.

Every error the library raises on bad input is an `EnsembleError` (a `ValueError`), so
`except ValueError` still catches it. Messages name the leaf path, shape and role, say
why it is wrong and how to fix it.
"""


class EnsembleError(ValueError):
    """Base class of every error ensemblenn raises about the user's input.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> double = enn.ensemble_map(lambda x: 2 * x)  # forgot in_roles=enn.PER_CHAIN
        >>> try:
        ...     double(jnp.zeros(4))
        ... except enn.EnsembleError as err:
        ...     print(type(err).__name__, isinstance(err, ValueError))
        ChainCountError True
    """


class EnsembleTypeError(EnsembleError, TypeError):
    """An argument of the wrong type: an `EnsembleError` that is also a `TypeError`, so
    either `except` catches it.

    Example:
        >>> import ensemblenn as enn
        >>> try:
        ...     enn.chain_keys(0, 4)
        ... except TypeError as err:
        ...     print(type(err).__name__, isinstance(err, enn.EnsembleError))
        EnsembleTypeError True
    """


class RoleError(EnsembleError):
    """A partition role is invalid, or is attached to something that cannot carry it.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> try:
        ...     enn.partition(jnp.zeros(4), in_roles="per_chain")
        ... except enn.RoleError as err:
        ...     print(str(err).split(";")[0])
        in_roles at the top level is 'per_chain' (a str)
    """


class ChainCountError(EnsembleError):
    """Per-chain leaves disagree on the number of chains, or it does not fit the mesh.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> add = enn.ensemble_map(lambda x, y: x + y, in_roles=enn.PER_CHAIN)
        >>> try:
        ...     add(jnp.zeros(4), jnp.zeros(8))
        ... except enn.ChainCountError as err:
        ...     print(str(err).splitlines()[0])
        Per-chain leaves disagree on the number of chains (their leading axis):
    """


class MeshError(EnsembleError):
    """The mesh or the named axis is unusable for an ensemble.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> double = enn.ensemble_map(lambda x: 2 * x, mesh=enn.default_mesh(), axis="walkers",
        ...                           in_roles=enn.PER_CHAIN)
        >>> try:
        ...     double(jnp.zeros(4))
        ... except enn.MeshError as err:
        ...     print(str(err).split(";")[0])
        The mesh has no axis named 'walkers'
    """


class MeshTypeError(MeshError, EnsembleTypeError):
    """`mesh` is not a `jax.sharding.Mesh`: a `MeshError` that is also a `TypeError`.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> from ensemblenn._errors import MeshTypeError
        >>> try:
        ...     enn.ensemble_map(lambda x: x, mesh="cpu", in_roles=enn.PER_CHAIN)
        ... except TypeError as err:
        ...     print(type(err).__name__, isinstance(err, enn.MeshError))
        MeshTypeError True
    """


class ClosureError(EnsembleError):
    """A function captures a `jax.Array` that cannot enter a `shard_map` body.

    Raised for any captured array with `closures="error"`, or when a capture cannot be
    lifted to an operand.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> data = jnp.arange(3.0)
        >>> def scale(x):
        ...     return x * data.sum()
        >>> try:
        ...     enn.ensemble_map(scale, in_roles=enn.PER_CHAIN, closures="error")(jnp.ones(4))
        ... except enn.ClosureError as err:
        ...     print(str(err).splitlines()[0])
        scale captures 1 jax.Array(s) by closure (closures='error'):
    """


class OutputRoleError(EnsembleError):
    """An output's declared role contradicts what the function computed.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: 2 * x, in_roles=enn.PER_CHAIN, out_roles=enn.BROADCAST)
        >>> try:
        ...     f(jnp.arange(4.0))
        ... except enn.OutputRoleError as err:
        ...     print(str(err).split(" but")[0])
        output (float32[]) is declared enn.BROADCAST
    """


class CollectiveError(EnsembleError):
    """A cross-chain collective was called outside `ensemble_map`.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> try:
        ...     enn.chain_mean(jnp.arange(4.0))
        ... except enn.CollectiveError as err:
        ...     print(str(err).split(",")[0])
        enn.chain_mean() was called outside a function run by ensemble_map
    """
