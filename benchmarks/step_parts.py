"""Where a `samplers.run` step's time goes on an accelerator: ablations, one at a time.

Each row is `samplers.run` (defaults) or the bare `ensemble_map(scan(step))` with one part
of the per-step work switched off (a probe, not an API: the rows tell which part to make
lean, they are not a mode a user can choose):

* `trace off`: `thin=0` (the public option: no draws kept);
* `plain sums`: the bare MALA scan with its proposal density summed by `jnp.sum` instead of
  `enn.ordered_sum`;
* `jax.random draws`: the bare MALA scan drawing through `jax.random` instead of
  `samplers.random` (the same numbers, another lowering);
* `no rounding`: the bare MALA scan with `enn.rounded` an identity (no FMA guard);
* `plain`: all three of the above at once, the closest to BlackJAX's MALA;
* `row written by vmap's scatter`: `samplers.run` writing its trace row with a plain
  `lax.dynamic_update_slice`, which `jax.vmap` turns into a clipped scatter (as the driver
  did before its batched write);
* `rows without statistics` / `thin=1`: `samplers.run` with trace rows of the position and
  zeros (the statistics left out of the row), or with every draw kept (no scratch row);
* `ordered_sum` / `jnp.sum` rows time the two sums alone on `(chains, 100)`.

Variants run one after another (a patch of a module's function changes what a cached
trace would have compiled, so JAX's caches are cleared between them; JAX's persistent
cache is keyed by the program, so it holds each variant apart), each the minimum and
median of `--repeats` calls after a compiling one. Meant for a lent accelerator machine;
it runs on a CPU too.
"""

import argparse
import contextlib
import statistics
from typing import Any

import jax
import jax.numpy as jnp

import ensemblenn as enn

from . import accelerator
from ._common import emit, print_machine

BENCH = "step_parts"

COLUMNS = [
    ("sampler", "sampler", ""),
    ("chains", "chains", "d"),
    ("variant", "variant", ""),
    ("step_us", "µs/step (min)", ".1f"),
    ("step_us_median", "(median)", ".1f"),
    ("first_s", "first call s", ".2f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="16384 (--full), else 512")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)


@contextlib.contextmanager
def _patched(*patches: tuple[Any, str, Any]) -> Any:
    """`setattr(obj, name, value)` for each patch, undone on exit; JAX's caches cleared on
    both sides (and the persistent cache is keyed by the program, which a patch changes)."""
    old = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    jax.clear_caches()
    try:
        yield
    finally:
        for obj, name, value in old:
            setattr(obj, name, value)
        jax.clear_caches()


def _jax_random() -> list[tuple[Any, str, Any]]:
    """`samplers.random`'s draws through `jax.random` (the same numbers)."""
    import samplers

    names = ("fold_in", "split", "uniform", "normal", "bernoulli", "randint")
    return [(samplers.random, name, getattr(jax.random, name)) for name in names]


def _no_rounding() -> list[tuple[Any, str, Any]]:
    """`enn.rounded` an identity, also where `enn.ordered_sum` calls it (a private module:
    this is a probe)."""
    from ensemblenn import _collectives  # private: a probe patches the guard

    return [(enn, "rounded", lambda x: x), (_collectives, "_round", lambda x: x)]


def _guards_everywhere() -> list[tuple[Any, str, Any]]:
    """The rounding guards acting in every frame, as before they were limited to frames
    that promise bits (a private function: this is a probe)."""
    from ensemblenn import _collectives  # private: a probe patches the guard

    return [(_collectives, "_bits_promised", lambda: True)]


def _plain_quadratic(r: Any, metric: Any) -> Any:
    return jnp.sum(r**2 / jnp.asarray(metric, r.dtype))


def _statistics_left_out(state: Any, info: Any, dtype: Any) -> Any:
    from samplers.driver import _chunk  # private: a probe patches the driver's step

    return jnp.zeros(len(_chunk.TRACE_STATS), dtype)


def _scatter_write(buffer: Any, row: Any, start: Any) -> Any:
    return jax.lax.dynamic_update_slice(buffer, row, start)  # vmap makes it a scatter


def _ablations(kind: str) -> list[tuple[str, str, list]]:
    """`(row, path of accelerator._calls, patches)` for one sampler, after its plain rows."""
    from samplers.driver import _chunk  # private: a probe patches the driver's step
    from samplers.kernels import mala as mala_module

    plain_sums = [(mala_module, "_inverse_quadratic", _plain_quadratic)]
    rows = []
    if kind == "mala":
        rows += [
            ("bare, plain sums", "bare", plain_sums),
            ("bare, jax.random draws", "bare", _jax_random()),
            ("bare, no rounding", "bare", _no_rounding()),
            ("bare, plain (all three)", "bare", plain_sums + _jax_random() + _no_rounding()),
        ]
    scatter = [(_chunk, "update_slice", _scatter_write)]
    rows.append(("run, row written by vmap's scatter", "defaults", scatter))
    if kind == "hmc":
        rows += [
            ("run, rows without statistics", "defaults",
             [(_chunk, "trace_stats", _statistics_left_out)]),
            ("run, thin=1", "thin=1", []),
        ]  # fmt: skip
    return rows


def run(args: argparse.Namespace) -> list[dict]:
    import warnings

    warnings.simplefilter("ignore")
    print_machine(BENCH)
    chains = args.chains or (16384 if args.full else (16 if args.smoke else 512))
    steps = 20 if args.smoke else args.steps
    records: list[dict] = []

    def record(sampler: str, variant: str, fn: Any) -> None:
        first, times = accelerator._timed(fn, args.repeats)
        emit(dict(benchmark=BENCH, sampler=sampler, chains=chains, variant=variant,
                  step_us=min(times) / steps * 1e6,
                  step_us_median=statistics.median(times) / steps * 1e6, first_s=first,
                  backend=jax.default_backend()), records)  # fmt: skip

    x = jax.random.normal(jax.random.key(0), (chains, 100))
    for name, total in (("jnp.sum", jnp.sum), ("enn.ordered_sum", enn.ordered_sum)):

        @jax.jit
        def sums(x: Any, total: Any = total) -> Any:
            def body(i: Any, acc: Any) -> Any:
                return acc + jax.vmap(total)(x * (1.0 + i.astype(x.dtype) * 1e-3))

            return jax.lax.fori_loop(0, steps, body, jnp.zeros(x.shape[0]))

        record("sum of 100", name, lambda: sums(x))

    for kind in ("mala", "hmc"):
        paths = ["bare", "defaults", "trace off", "blackjax"]
        for variant, fn in accelerator._calls(kind, "gauss100", chains, steps, paths).items():
            record(kind, variant, fn)
        for variant, path, patches in _ablations(kind):
            with _patched(*patches):
                (fn,) = accelerator._calls(kind, "gauss100", chains, steps, [path]).values()
                record(kind, variant, fn)
    return records
