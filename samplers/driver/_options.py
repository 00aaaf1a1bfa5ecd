"""The options of one `samplers.run` call: checked once, before anything compiles, into one
`RunOptions` that the setup, the checkpoint's fingerprint and every `enn.ensemble_map` of
the run read (`RunOptions.mapping`). A new option is a field here and a keyword of `run`."""

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax

import ensemblenn as enn

from .._errors import SamplerError, SamplerTypeError
from ..checkpoint import CheckpointError, check_dir
from ._validate import is_int


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Every keyword option of `samplers.run`, as given (resolved values, such as an
    automatic `thin`, live in the `Setup`); build it with `RunOptions.checked`.

    Example:
        >>> from samplers.driver._options import RunOptions
        >>> options = RunOptions.checked(8, num_steps=100, block_size="auto")
        >>> options.mapping
        {'mesh': None, 'axis': 'chains', 'block_size': 'auto'}
        >>> RunOptions.checked(8, num_steps=100, superchain_size=3)
        Traceback (most recent call last):
        ...
        samplers.SamplerError: superchain_size=3 does not divide the 8 chains.
          fix: a divisor of 8 (superchains of consecutive chains, all the same size).
    """

    num_steps: int
    num_warmup: int = 0
    thin: int | None = None
    reference: Any = None
    superchain_size: int | None = None
    track_bias: bool = False
    chunk_size: int | None = None
    mesh: Any = None
    axis: str = "chains"
    block_size: int | Literal["auto"] | None = None
    progress: bool | None = None
    checkpoint_dir: Any = None
    checkpoint_every: int | None = None
    resume: bool = False
    on_chunk: Callable[[int, int], None] | None = None

    @classmethod
    def checked(cls, num_chains: int, **options: Any) -> "RunOptions":
        """The options, after the checks whose mistakes would otherwise surface late
        (after every step ran, or as a raw JAX error)."""
        self = cls(**options)
        _check_values(num_chains, self.chunk_size, self.superchain_size, self.reference,
                      self.block_size, self.checkpoint_every, self.track_bias)  # fmt: skip
        _check_flags(self.progress, self.resume, self.mesh, self.axis, self.checkpoint_dir)
        _check_on_chunk(self.on_chunk)
        return self

    @property
    def mapping(self) -> dict[str, Any]:
        """The keyword arguments of every `enn.ensemble_map` of the run: the mesh, the
        chains' axis and the block size go to the `shard_map` from here, and only here."""
        return dict(mesh=self.mesh, axis=self.axis, block_size=self.block_size)


def _check_values(
    num_chains: int,
    chunk_size: Any,
    superchain_size: Any,
    reference: Any,
    block_size: Any,
    checkpoint_every: Any,
    track_bias: Any,
) -> None:
    """The options whose mistakes would otherwise surface late (after every step ran)."""
    for name, value, error in (
        ("chunk_size", chunk_size, SamplerError),
        ("checkpoint_every", checkpoint_every, CheckpointError),  # a SamplerError too
    ):
        if value is not None and (not is_int(value) or value < 1):
            raise (error if is_int(value) else SamplerTypeError)(
                f"{name} must be None or an int >= 1, got {value!r}.\n  fix: {name}=None "
                "(the default) or a positive number of steps."
            )
    if superchain_size is not None:
        # None: chosen automatically for many short chains (samplers.driver._verdict); 0: none.
        if not is_int(superchain_size) or superchain_size < 0:
            raise (SamplerError if is_int(superchain_size) else SamplerTypeError)(
                f"superchain_size must be None, 0 or an int >= 1, got {superchain_size!r}.\n"
                f"  fix: a divisor of the {num_chains} chains, e.g. superchain_size=2 (0: no "
                "superchains, the verdict reads split R-hat)."
            )
        if superchain_size and num_chains % superchain_size:
            raise SamplerError(
                f"superchain_size={superchain_size} does not divide the {num_chains} chains.\n"
                f"  fix: a divisor of {num_chains} (superchains of consecutive chains, all the "
                "same size)."
            )
    if (
        block_size is not None
        and block_size != "auto"
        and (not is_int(block_size) or block_size < 1)
    ):
        raise (SamplerError if is_int(block_size) else SamplerTypeError)(
            f'block_size must be "auto", None or an int >= 1, got {block_size!r}.\n  fix: '
            'block_size="auto" (the default).'
        )
    if reference is not None and not hasattr(reference, "second_moment"):
        raise SamplerTypeError(
            f"reference must be None or a samplers.targets.Moments (known moments of the "
            f"target), got {reference!r}.\n  fix: reference=target.reference, or leave it out."
        )
    if not isinstance(track_bias, bool):
        raise SamplerTypeError(f"track_bias must be True or False, got {track_bias!r}.")


def _check_on_chunk(on_chunk: Any) -> None:
    if on_chunk is not None and not callable(on_chunk):
        raise SamplerTypeError(
            f"on_chunk must be a callable on_chunk(step, total) or None, got "
            f"{type(on_chunk).__name__}.\n  fix: on_chunk=lambda step, total: print(step, "
            "'of', total)."
        )


def _check_flags(
    progress: Any, resume: Any, mesh: Any, axis: Any, checkpoint_dir: Any = None
) -> None:
    """The flags, the mesh and the checkpoint folder of `samplers.run` (before anything
    compiles: the checkpoint store only opens the folder after the setup)."""
    for name, value, allowed in (
        ("progress", progress, "True, False or None (None: when stderr is a terminal)"),
        ("resume", resume, "True or False"),
    ):
        if not isinstance(value, bool) and not (name == "progress" and value is None):
            raise SamplerTypeError(f"{name} must be {allowed}, got {value!r}.")
    if not isinstance(axis, str):
        raise SamplerTypeError(
            f"axis must be the name of the mesh axis over chains (a str), got {axis!r}.\n"
            '  fix: axis="chains" (the default).'
        )
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh | jax.sharding.AbstractMesh):
        raise SamplerTypeError(
            f"mesh must be None or a jax.sharding.Mesh, got {mesh!r} ({type(mesh).__name__})."
            "\n  fix: mesh=jax.make_mesh((jax.device_count(),), ('chains',)), or None for "
            "the default."
        )
    if mesh is not None:
        enn.resolve_mesh(mesh, axis)  # the axis must exist: enn.MeshError names it
    check_dir(checkpoint_dir)
