"""The errors a checkpoint raises (both `samplers.SamplerError`s)."""

from .._errors import SamplerError


class CheckpointError(SamplerError):
    """A checkpoint cannot be written or used: missing, unreadable, corrupt, locked by
    another run, or unexpected.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> try:   # resume=True, but no checkpoint_dir to resume from
        ...     samplers.run(samplers.MALA(step_size=0.5), lambda x: -0.5 * (x**2).sum(),
        ...                  jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=10, resume=True)
        ... except samplers.CheckpointError as err:
        ...     print(str(err).splitlines()[0])
        resume and checkpoint_every need a checkpoint_dir.
    """


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written by a run with another configuration (sampler, target,
    shapes, key, step counts, ...), so resuming from it would not continue this run.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp, samplers
        >>> folder = tempfile.mkdtemp()
        >>> args = (samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(), jnp.zeros((8, 2)))
        >>> _ = samplers.run(*args, key=jax.random.key(0), num_steps=10, progress=False,
        ...                  checkpoint_dir=folder)
        >>> try:   # resuming with another number of steps
        ...     samplers.run(*args, key=jax.random.key(0), num_steps=20, progress=False,
        ...                  checkpoint_dir=folder, resume=True)
        ... except samplers.CheckpointMismatchError as err:
        ...     print(str(err).splitlines()[1])
          num_steps: 10 in the checkpoint, 20 in this run
    """


# Shown by their public names in tracebacks and on the docs pages.
CheckpointError.__module__ = CheckpointMismatchError.__module__ = "samplers"
