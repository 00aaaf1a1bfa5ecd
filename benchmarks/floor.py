"""Sampler steps vs the gradient floor: the bare `vmap(grad(logdensity))` over the same chains.

Both sides run K steps inside one compiled program and are timed the same way (minimum and
median over interleaved repetitions). The floor is `jax.jit` of a `lax.scan` of K
`x <- x + 1e-6 * vmap(grad(logdensity))(x)` updates over the chains, sharded like ours (the
tiny update keeps XLA from hoisting the gradient out of the loop). The samplers run through
`enn.ensemble_map` (a `lax.scan` of K `kernel.step` calls in the per-chain function), and
through the whole driver, `samplers.run(..., num_steps=K, chunk_size=K)`, second call
(with streaming moments; no trace, no b² tracking).

`ratio` = step time / (gradients per step * floor time per gradient): 1.0 would mean the
sampler costs nothing beyond its gradients. The kernels also need random numbers: one
`dim`-vector of normals per chain per step (MALA's noise, HMC's momentum; MCLMC's partial
refresh) and a uniform for the accept test, from each chain's own key (`fold_in` of the
step). The `draws` row times exactly that (a `lax.scan` of K per-chain `fold_in` + normal +
uniform draws), and `ratio_with_draws` = step time / (grads per step * floor per gradient
+ draws per step): 1.0 would mean the kernel costs nothing beyond its gradients and draws.
The kernels draw those very numbers (bit for bit) through `samplers.random`, whose
unrolled hash is cheaper on CPU than `jax.random`'s rolled loop: the `own draws` row times
that, and `ratio_with_own_draws` uses it in place of the `draws` row.
"""

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn
import samplers

from ._common import emit, gaussian, logistic, mesh_for, print_machine
from .overhead import interleaved

BENCH = "floor"

COLUMNS = [
    ("target", "target", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("impl", "sampler", ""),
    ("path", "path", ""),
    ("grads_per_step", "grads/step", "d"),
    ("step_us", "µs/step (min)", ".1f"),
    ("us_per_grad", "µs/grad", ".1f"),
    ("ratio", "ratio to floor", ".2f"),
    ("ratio_median", "ratio (median)", ".2f"),
    ("ratio_with_draws", "ratio to grads+draws", ".2f"),
    ("ratio_with_draws_median", "(median)", ".2f"),
    ("ratio_with_own_draws", "ratio to grads+own draws", ".2f"),
    ("ratio_with_own_draws_median", "(median)", ".2f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="default 512 (--full 8192)")
    p.add_argument("--steps", type=int, default=None, help="K (default 100)")
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="interleaved timings per variant (default 5; the samplers.run rows "
        "take max(3, repeats // 3))",
    )
    p.add_argument(
        "--targets", default=None, help="gauss100,logreg50 (default both; --smoke: gauss100)"
    )
    p.add_argument("--no-driver", action="store_true", help="skip the samplers.run rows")


def kernels() -> dict[str, Any]:
    return {
        "MALA": samplers.MALA(step_size=0.1),
        "HMC (10 leapfrog)": samplers.HMC(step_size=0.1, num_integration_steps=10, jitter=False),
        "MCLMC (McLachlan)": samplers.MCLMC(step_size=0.5, L=5.0),
        "AdjustedMCLMC (5 McLachlan)": samplers.AdjustedMCLMC(
            step_size=0.5, num_integration_steps=5
        ),
    }


def _draws_scan(random: Any, sharded: NamedSharding, steps: int) -> Any:
    """A jitted scan of `steps` per-chain `fold_in` + normal + uniform draws from `random`
    (`jax.random` or `samplers.random`: the same numbers)."""

    def one(x: Any, key: Any, i: Any) -> Any:
        k = random.fold_in(key, i)
        return x + 1e-6 * random.normal(k, x.shape) * random.uniform(random.fold_in(k, 1))

    @jax.jit
    def scan(x: Any, keys: Any) -> Any:
        def body(x: Any, i: Any) -> tuple:
            return jax.vmap(one, in_axes=(0, 0, None))(x, keys, i), None

        x = jax.lax.with_sharding_constraint(x, sharded)
        return jax.lax.scan(body, x, jnp.arange(steps))[0]

    return scan


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    if args.smoke:
        chains, steps, repeats, dim, data = 8, 5, 3, 6, (100, 4, 20_000)
    elif args.full:
        chains, steps, repeats, dim, data = 8192, 100, 20, 100, (1000, 50, 200_000)
    else:
        chains, steps, repeats, dim, data = 512, 100, 5, 100, (1000, 50, 200_000)
    chains, steps = args.chains or chains, args.steps or steps
    repeats = args.repeats or repeats
    n = args.num_devices
    mesh = mesh_for(n)
    sharded = NamedSharding(mesh, P("chains"))
    records: list[dict] = []
    names = args.targets or ("gauss100" if args.smoke else "gauss100,logreg50")
    for name in names.split(","):
        target = gaussian(dim) if name == "gauss100" else logistic(*data)
        x0 = jax.device_put(
            jax.random.normal(jax.random.key(args.seed), (chains, target.dim)), sharded
        )
        keys = enn.chain_keys(jax.random.key(args.seed + 1), chains)

        @jax.jit
        def floor(t: Any, x: Any) -> Any:
            def body(x: Any, _: Any) -> tuple:
                return x + 1e-6 * jax.vmap(jax.grad(t))(x), None

            x = jax.lax.with_sharding_constraint(x, sharded)
            return jax.lax.scan(body, x, None, length=steps)[0]

        # The kernels' draws, from jax.random and from samplers.random (the same numbers,
        # the hash unrolled: what the kernels call, and what the `own draws` row measures).
        draws = _draws_scan(jax.random, sharded, steps)
        own_draws = _draws_scan(samplers.random, sharded, steps)

        fns = {"floor": floor, "draws": draws, "own_draws": own_draws}
        call_args = {"floor": (target, x0), "draws": (x0, keys), "own_draws": (x0, keys)}
        grads: dict[str, int] = {}
        for label, kernel in kernels().items():
            init = enn.ensemble_map(
                lambda k, t, x, key: k.init(t, x, key),
                mesh=mesh,
                in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
                out_roles=enn.PER_CHAIN,
            )
            state = init(kernel, target, x0, keys)

            def scan(k: Any, t: Any, s: Any, key: Any) -> Any:
                def body(s: Any, i: Any) -> tuple:
                    s, info = k.step(t, s, jax.random.fold_in(key, i))
                    return s, info.num_grads

                s, g = jax.lax.scan(body, s, jnp.arange(steps))
                return s, g.sum()

            mapped = enn.ensemble_map(
                scan,
                mesh=mesh,
                in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
                out_roles=enn.PER_CHAIN,
            )
            placed = (kernel, jax.device_put(target, NamedSharding(mesh, P())), state, keys)
            fns[label] = mapped
            call_args[label] = placed
            _, g = mapped(*placed)
            grads[label] = int(g[0]) // steps
        timing = interleaved(fns, call_args, repeats, number=1)
        floor_min, floor_med = timing["floor"]
        per_grad, per_grad_med = floor_min / steps, floor_med / steps
        draw, draw_med = timing["draws"][0] / steps, timing["draws"][1] / steps
        own, own_med = timing["own_draws"][0] / steps, timing["own_draws"][1] / steps
        for impl, path, t in [
            ("draws", "jit(scan(vmap(jax.random fold_in, normal, uniform)))", draw),
            ("own draws", "the same numbers, samplers' unrolled Threefry", own),
        ]:
            emit(
                dict(
                    benchmark=BENCH,
                    target=name,
                    devices=n,
                    chains=chains,
                    impl=impl,
                    path=path,
                    grads_per_step=0,
                    step_us=t * 1e6,
                    steps=steps,
                ),
                records,
            )
        emit(
            dict(
                benchmark=BENCH,
                target=name,
                devices=n,
                chains=chains,
                impl="floor",
                path="jit(scan(vmap(grad)))",
                grads_per_step=1,
                step_us=per_grad * 1e6,
                us_per_grad=per_grad * 1e6,
                ratio=1.0,
                ratio_median=1.0,
                steps=steps,
            ),
            records,
        )
        for label in kernels():
            t_min, t_med = timing[label]
            g = max(grads[label], 1)
            emit(
                dict(
                    benchmark=BENCH,
                    target=name,
                    devices=n,
                    chains=chains,
                    impl=label,
                    path="ensemble_map(scan)",
                    grads_per_step=grads[label],
                    step_us=t_min / steps * 1e6,
                    us_per_grad=t_min / steps / g * 1e6,
                    ratio=t_min / steps / g / per_grad,
                    ratio_median=t_med / steps / g / per_grad_med,
                    ratio_with_draws=t_min / steps / (g * per_grad + draw),
                    ratio_with_draws_median=t_med / steps / (g * per_grad_med + draw_med),
                    ratio_with_own_draws=t_min / steps / (g * per_grad + own),
                    ratio_with_own_draws_median=t_med / steps / (g * per_grad_med + own_med),
                    steps=steps,
                ),
                records,
            )
        if args.no_driver:
            continue
        for label, kernel in kernels().items():

            def call(kernel: Any = kernel) -> Any:
                return jax.block_until_ready(
                    samplers.run(
                        kernel,
                        target,
                        x0,
                        key=jax.random.key(args.seed + 2),
                        num_steps=steps,
                        chunk_size=steps,
                        mesh=mesh,
                        progress=False,
                    )
                )

            call()
            best = float("inf")
            for _ in range(max(3, repeats // 3)):
                t0 = time.perf_counter()
                result = call()
                best = min(best, time.perf_counter() - t0)
            g = max(int(result.num_grads[0]) // steps, 1)
            emit(
                dict(
                    benchmark=BENCH,
                    target=name,
                    devices=n,
                    chains=chains,
                    impl=label,
                    path="samplers.run (whole call)",
                    grads_per_step=g,
                    step_us=best / steps * 1e6,
                    us_per_grad=best / steps / g * 1e6,
                    ratio=best / steps / g / per_grad,
                    ratio_with_draws=best / steps / (g * per_grad + draw),
                    steps=steps,
                ),
                records,
            )
    return records
