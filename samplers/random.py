"""Per-chain random numbers for kernels: `jax.random`'s very numbers, cheaper on CPU.

The one home of randomness in `samplers`: every kernel, integrator and adaptation draws
through this module (the unrolled Threefry behind it is private to it).

`fold_in`, `split`, `uniform`, `normal`, `bernoulli` and `randint` return exactly what their
`jax.random` namesakes return (tests compare the bits), so a kernel can switch between the
two without changing a single draw. For a Threefry key (JAX's default) they write the hash
out as straight-line integer arithmetic that XLA fuses into one kernel, where `jax.random`
lowers it on CPU as a loop whose fixed cost per iteration dominates small per-chain draws
(a `fold_in` per step was ~60 µs of a 140 µs ensemble step for 256 walkers; the hash ~60 %
of a 100-d normal draw for 512 chains). Any other key, dtype or size goes to `jax.random`.

`uniforms` and `normals` are this module's own stream, not `jax.random`'s: all of one
walker's numbers from one hash of its key (the ensemble moves draw with them).

Example:
    >>> import jax, numpy as np, samplers
    >>> key = jax.random.key(0)
    >>> mine = samplers.random.normal(samplers.random.fold_in(key, 3), (4,))
    >>> theirs = jax.random.normal(jax.random.fold_in(key, 3), (4,))
    >>> bool(np.array_equal(mine, theirs))
    True
"""

from ._threefry import bernoulli, fold_in, normal, normals, randint, split, uniform, uniforms

__all__ = [
    "fold_in",
    "split",
    "uniform",
    "normal",
    "bernoulli",
    "randint",
    "uniforms",
    "normals",
]
