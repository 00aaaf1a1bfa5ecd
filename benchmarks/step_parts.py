"""Where a `samplers.run` step's time goes on an accelerator: ablations, one at a time.

Each row is `samplers.run` (defaults) or the bare `ensemble_map(scan(step))` with one part
of the per-step work switched off (a probe, not an API: the rows tell which part to make
lean, they are not a mode a user can choose):

* `trace off`: `thin=0` (the public option: no draws kept);
* `plain sums`: the bare MALA scan with its proposal density summed by `jnp.sum` instead of
  `enn.ordered_sum` (patched in the bare kernel only: `samplers.run` keeps its compiled
  programs, so a patch does not reach them; a first try at patching the moments there
  timed the unpatched program);
* `ordered_sum` / `jnp.sum` rows time the two sums alone on `(chains, 100)`.

Variants run one after another (a patch changes what a cached trace would have compiled,
so JAX's caches are cleared between them), each the minimum and median of `--repeats`
calls after a compiling one. Meant for a lent accelerator machine; it runs on a CPU too.
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
def _patched(obj: Any, name: str, value: Any) -> Any:
    old = getattr(obj, name)
    setattr(obj, name, value)
    jax.clear_caches()
    try:
        yield
    finally:
        setattr(obj, name, old)
        jax.clear_caches()


def run(args: argparse.Namespace) -> list[dict]:
    import warnings

    from samplers.kernels import mala as mala_module

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

    def plain_quadratic(r: Any, metric: Any) -> Any:
        return jnp.sum(r**2 / jnp.asarray(metric, r.dtype))

    for kind in ("mala", "hmc"):
        paths = ["bare", "defaults", "trace off"]
        for variant, fn in accelerator._calls(kind, "gauss100", chains, steps, paths).items():
            record(kind, variant, fn)
        if kind == "mala":
            with _patched(mala_module, "_inverse_quadratic", plain_quadratic):
                calls = accelerator._calls(kind, "gauss100", chains, steps, ["bare"])
                record(kind, "bare, plain sums", calls["bare ensemble_map(scan)"])
    return records
