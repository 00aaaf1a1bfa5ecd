"""`samplers.run` (defaults, bitwise mode), the bare kernel scan and BlackJAX, per step.

The rows of issue "Accelerators first": HMC (10 leapfrog steps), MALA and NUTS on gauss100
(variances 1..100, the metric given), and HMC on logreg50, at the same step size, chains and
steps on every side. Each side is a whole call timed from the host (one compiling call, then
the minimum and median of `--repeats` interleaved calls), per step:

* `run (defaults)`: `samplers.run(kernel, ...)` as a user calls it (one batch per device;
  on an accelerator each chunk's length compiled in, so the loop has a known trip count);
* `run (bitwise)`: `samplers.run(..., block_size="auto")` (blocks of `num_chains // 8`),
  the same bits on any device count;
* `bare`: `enn.ensemble_map` of a `lax.scan` of `kernel.step` (no driver);
* `blackjax`: `jax.jit` of a `lax.scan` of `jax.vmap(kernel.step)` (BlackJAX 1.x);
* `blackjax kept`: the same scan keeping every `thin`-th position as the scan's outputs,
  `thin` as `samplers.run`'s defaults choose it: the same draws kept on both sides (the
  defaults keep a trace; the plain `blackjax` row keeps none).

`ratio` is each row's minimum over BlackJAX's (or over the bare scan's when BlackJAX is not
installed). No row is a timed assertion; the page docs/benchmarks.md records the figures.
"""

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp

import ensemblenn as enn
import samplers

from ._common import emit, have, print_machine, skipped

BENCH = "accelerator"

COLUMNS = [
    ("sampler", "sampler", ""),
    ("target", "target", ""),
    ("chains", "chains", "d"),
    ("impl", "path", ""),
    ("step_us", "µs/step (min)", ".1f"),
    ("step_us_median", "(median)", ".1f"),
    ("ratio", "ratio to BlackJAX", ".2f"),
    ("first_s", "first call s", ".2f"),
]

ROWS_FULL = (
    "hmc:gauss100:16384,mala:gauss100:16384,nuts:gauss100:16384,"
    "hmc:gauss100:65536,nuts:gauss100:65536,hmc:logreg50:16384,mala:logreg50:16384"
)
ROWS_CPU = "hmc:gauss100:512,mala:gauss100:512,nuts:gauss100:256,hmc:logreg50:256"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", default=None, help=f"sampler:target:chains,... ({ROWS_CPU})")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", default="defaults,bitwise,bare,blackjax,blackjax kept")


def _target(name: str) -> tuple[Any, Any, float]:
    """`(logdensity of one chain, inverse mass matrix, step size)`."""
    if name == "gauss100":
        variances = jnp.logspace(0, 2, 100)
        return (lambda x: -0.5 * jnp.sum(x * x / variances)), variances, 0.3
    if name == "logreg50":
        target = samplers.targets.LogisticRegression(num_data=1000, num_features=50)
        return target, jnp.ones(target.dim), 0.02
    raise SystemExit(f"--rows: unknown target {name!r}")


def _kernels(kind: str, logdensity: Any, metric: Any, step: float) -> tuple[Any, Any]:
    """Ours and BlackJAX's (None without BlackJAX), with the same settings."""
    bj = None
    if kind == "hmc":
        # A fixed path of 10, as BlackJAX's: the same workload on both sides.
        ours = samplers.HMC(
            step_size=step, num_integration_steps=10, inverse_mass_matrix=metric, jitter=False
        )
    elif kind == "mala":
        ours = samplers.MALA(step_size=step)
    elif kind == "nuts":
        ours = samplers.NUTS(step_size=0.5, inverse_mass_matrix=metric)
    else:
        raise SystemExit(f"--rows: unknown sampler {kind!r}")
    if have("blackjax"):
        import blackjax

        bj = {
            "hmc": lambda: blackjax.hmc(
                logdensity, step_size=step, inverse_mass_matrix=metric, num_integration_steps=10
            ),
            "mala": lambda: blackjax.mala(logdensity, step_size=step),
            "nuts": lambda: blackjax.nuts(logdensity, step_size=0.5, inverse_mass_matrix=metric),
        }[kind]()
    return ours, bj


def _timed(fn: Any, repeats: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, times


def _calls(kind: str, target: str, chains: int, steps: int, paths: list[str]) -> dict:
    logdensity, metric, step = _target(target)
    ours, bj = _kernels(kind, logdensity, metric, step)
    dim = metric.shape[0]
    x0 = jax.random.normal(jax.random.key(0), (chains, dim)) * jnp.sqrt(metric)
    calls: dict[str, Any] = {}

    def run(block: Any, **options: Any) -> Any:
        return lambda: samplers.run(
            ours, logdensity, x0, key=jax.random.key(1), num_steps=steps, progress=False,
            block_size=block, **options,
        ).state.position  # fmt: skip

    if "defaults" in paths:
        calls["run (defaults)"] = run(None)
    if "trace off" in paths:  # benchmarks step_parts: the defaults without the trace
        calls["run, trace off (thin=0)"] = run(None, thin=0)
    if "thin=1" in paths:  # benchmarks step_parts: every draw kept
        calls["run, thin=1"] = run(None, thin=1)
    if "bitwise" in paths:
        calls["run (bitwise)"] = run("auto")
    if "bare" in paths:

        def chain(position: Any, key: Any) -> Any:
            state = ours.init(logdensity, position, key)

            def body(s: Any, k: Any) -> Any:
                return ours.step(logdensity, s, k)[0], None

            return jax.lax.scan(body, state, jax.random.split(key, steps))[0].position

        bare = enn.ensemble_map(chain, in_roles=enn.PER_CHAIN)
        keys = enn.chain_keys(jax.random.key(1), chains)
        calls["bare ensemble_map(scan)"] = lambda: bare(x0, keys)
    if "blackjax" in paths and bj is not None:
        calls["blackjax vmap"] = _blackjax(bj, x0, steps)
    if "blackjax kept" in paths and bj is not None:
        calls["blackjax vmap, draws kept"] = _blackjax(bj, x0, steps, keep=True)
    return calls


def _blackjax(bj: Any, x0: Any, steps: int, keep: bool = False) -> Any:
    """BlackJAX's scan of `vmap(step)`: the final positions, and with `keep` every
    `thin`-th position stacked as the scan's outputs, `thin` by the rule `samplers.run`'s
    defaults use for the memory budget (a private function: the benchmark must keep
    what the library keeps)."""
    # private: the budget the defaults use, read rather than copied
    from samplers.driver._chunk import TRACE_STATS
    from samplers.driver._setup import automatic_thin  # private: as above

    chains, dim = x0.shape
    row_bytes = (dim + len(TRACE_STATS)) * x0.dtype.itemsize
    thin = max(1, automatic_thin(chains, steps, row_bytes)) if keep else steps
    kept, rest = divmod(steps, thin)
    start = jax.vmap(bj.init)(x0)

    def one(s: Any, k: Any) -> Any:
        return jax.vmap(bj.step)(jax.random.split(k, chains), s)[0]

    @jax.jit
    def run(state: Any, key: Any) -> Any:
        keys = jax.random.split(key, steps)

        def group(s: Any, ks: Any) -> Any:
            s = jax.lax.scan(lambda s, k: (one(s, k), None), s, ks)[0]
            return s, s.position if keep else None

        grouped = keys[: kept * thin].reshape(kept, thin, *keys.shape[1:])
        state, draws = jax.lax.scan(group, state, grouped)
        state = jax.lax.scan(lambda s, k: (one(s, k), None), state, keys[kept * thin :])[0]
        return (state.position, draws) if keep else state.position

    return lambda: run(start, jax.random.key(1))


def run(args: argparse.Namespace) -> list[dict]:
    import statistics
    import warnings

    warnings.simplefilter("ignore")  # verdicts of short timing runs are not the point
    print_machine(BENCH)
    rows = args.rows or (ROWS_FULL if args.full else ROWS_CPU)
    steps = 20 if args.smoke else args.steps
    if args.smoke:
        rows = "hmc:gauss100:16,mala:gauss100:16"
    paths = [p.strip() for p in args.paths.split(",")]
    records: list[dict] = []
    for path, impl in (
        ("blackjax", "blackjax vmap"),
        ("blackjax kept", "blackjax vmap, draws kept"),
    ):
        if path in paths and not have("blackjax"):
            emit(skipped(BENCH, impl, "blackjax"), records)
    for row in rows.split(","):
        kind, target, chains = row.split(":")
        chains = int(chains)
        calls = _calls(kind, target, chains, steps, paths)
        first, times = {}, {name: [] for name in calls}
        for name, fn in calls.items():
            first[name], _ = _timed(fn, 0)
        for _ in range(args.repeats):  # interleaved: a slow moment hits every side
            for name, fn in calls.items():
                times[name] += _timed(fn, 1)[1]
        base_name = "blackjax vmap" if "blackjax vmap" in calls else "bare ensemble_map(scan)"
        base = min(times.get(base_name) or [float("nan")])
        for name in calls:
            emit(
                dict(
                    benchmark=BENCH, sampler=kind, target=target, chains=chains, impl=name,
                    steps=steps, step_us=min(times[name]) / steps * 1e6,
                    step_us_median=statistics.median(times[name]) / steps * 1e6,
                    ratio=min(times[name]) / base, ratio_to=base_name, first_s=first[name],
                    backend=jax.default_backend(),
                ),
                records,
            )  # fmt: skip
    return records
