"""Plumbing shared by the benchmarks: devices, clocks, targets, JSON lines and tables.

Nothing here imports JAX at module level: `__main__` imports this module before it has
fixed the device count.
"""

import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

DEVICE_FLAG = "--xla_force_host_platform_device_count"

# --- devices and processes ---------------------------------------------------------------


def set_device_count(n: int) -> None:
    """Simulate `n` CPU devices (must run before JAX initialises its backends).

    Replaces any device-count flag already in `XLA_FLAGS` (the test suite sets 4). On an
    accelerator the flag is harmless and meshes take the first `n` real devices.
    """
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"{DEVICE_FLAG}={n}"])


def parse_devices(text: str | None, default: Sequence[int]) -> tuple[int, ...]:
    if text is None:
        return tuple(default)
    try:
        values = tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"--devices: an int or a comma-separated list, not {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--devices must be positive, got {text!r}")
    return values


def strip_option(argv: list[str], name: str) -> list[str]:
    """`argv` without `name VALUE` / `name=VALUE`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if a.startswith(name + "="):
            continue
        out.append(a)
    return out


def fan_out(name: str, argv: list[str], devices: Sequence[int]) -> list[dict]:
    """Run `python -m benchmarks name --devices n` for each `n`; merge their JSON lines.

    Children inherit stderr; their stdout is parsed (JSON lines kept, '#' lines echoed).
    """
    records: list[dict] = []
    argv = strip_option(argv, "--devices")
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    for n in devices:
        cmd = [sys.executable, "-m", "benchmarks", name, "--devices", str(n), "--no-table", *argv]
        print(f"# running: {' '.join(cmd[1:])}", flush=True)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
            print(line, flush=True)
        rc = proc.wait()
        if rc != 0:
            rec = {
                "benchmark": name,
                "devices": n,
                "status": "crashed",
                "error": f"subprocess exited with status {rc}",
            }
            print(json.dumps(rec), flush=True)
            records.append(rec)
    return records


def have(module: str) -> bool:
    """Whether an optional peer is importable (and not hidden by ENSEMBLENN_BENCH_HIDE, a
    comma-separated list of peers to treat as absent, which the tests use to check that
    a benchmark still runs our side without them)."""
    hidden = {m.strip() for m in os.environ.get("ENSEMBLENN_BENCH_HIDE", "").split(",")}
    return module not in hidden and importlib.util.find_spec(module) is not None


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    import jax

    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "blackjax": version("blackjax"),
        "numpyro": version("numpyro"),
        "emcee": version("emcee"),
    }


def print_machine(name: str) -> None:
    print(f"# {name}: " + json.dumps(machine()), flush=True)


def mesh_for(n: int, explicit: bool = False) -> Any:
    """A 1-D mesh named 'chains' over the first `n` devices (Auto axis unless `explicit`)."""
    import jax
    from jax.sharding import AxisType

    if jax.device_count() < n:
        raise SystemExit(f"asked for {n} devices, JAX sees {jax.device_count()}")
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh((n,), ("chains",), axis_types=(kind,), devices=jax.devices()[:n])


# --- records and tables ------------------------------------------------------------------


def _plain(x: Any) -> Any:
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def emit(record: dict, records: list[dict] | None = None) -> dict:
    """Print one configuration as a JSON line (and keep it in `records`)."""
    record.setdefault("status", "ok")
    record.setdefault("load_avg_1m", round(os.getloadavg()[0], 2))
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()
    }
    print(json.dumps(clean, default=_plain), flush=True)
    if records is not None:
        records.append(clean)
    return clean


def error_text(err: BaseException) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {first}"[:300]


def skipped(benchmark: str, impl: str, module: str, **fields: Any) -> dict:
    return {
        "benchmark": benchmark,
        "impl": impl,
        "status": "skipped",
        "error": f"{module} is not installed (pip install 'ensemblenn[bench]')",
        **fields,
    }


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and fmt:
        try:
            return format(value, fmt)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def print_table(
    records: list[dict], columns: Sequence[tuple[str, str, str]], title: str = ""
) -> None:
    """A Markdown table of `records`; `columns` are `(key, header, format spec)`.

    A record with an error gets it in a trailing 'note' column.
    """
    rows = [r for r in records if r.get("benchmark")]
    if not rows:
        return
    with_note = any(r.get("error") or r.get("note") for r in rows)
    headers = [h for _, h, _ in columns] + (["note"] if with_note else [])
    print()
    if title:
        print(f"## {title}")
        print()
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for r in rows:
        cells = [_fmt(r.get(k), f) for k, _, f in columns]
        if with_note:
            note = r.get("error") or r.get("note") or ""
            cells.append(str(note).replace("|", "/"))
        print("| " + " | ".join(cells) + " |")
    print(flush=True)


# --- clocks ------------------------------------------------------------------------------

_SPANS: list[tuple[float, float]] = []  # (start, end) of every compile event
_COMPILES = [0]
_LISTENING = False


def _listen() -> None:
    global _LISTENING
    if _LISTENING:
        return
    import jax

    # JAX's compile events (the values of jax._src.dispatch.*_EVENT; spelled out here so
    # the benchmarks import no private module).
    backend = "/jax/core/compile/backend_compile_duration"
    events = {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        backend,
    }

    def listener(event: str, start: float, end: float, **_: Any) -> None:
        if event in events:
            _SPANS.append((start, end))
        if event == backend:
            _COMPILES[0] += 1

    jax.monitoring.register_event_time_span_listener(listener)
    _LISTENING = True


def _union(spans: Sequence[tuple[float, float]]) -> float:
    """Total length covered by possibly nested or overlapping intervals (a jit traced
    inside another jit's tracing reports its own, nested, event)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class Clock:
    """Wall time of a block, and the JAX compilation (tracing + lowering + XLA) inside it.

    Compilation is the union of JAX's compile-event time spans, so nested events (a jitted
    function traced while tracing another) are not counted twice.
    """

    wall: float = 0.0
    compile_s: float = 0.0
    compiles: int = 0

    @property
    def run_s(self) -> float:
        """Wall time minus compilation: what the computation itself took (plus dispatch)."""
        return max(self.wall - self.compile_s, 0.0)


@contextlib.contextmanager
def clock() -> Iterator[Clock]:
    _listen()
    c = Clock()
    i0, n0, t0 = len(_SPANS), _COMPILES[0], time.perf_counter()
    try:
        yield c
    finally:
        c.wall = time.perf_counter() - t0
        c.compile_s = _union(_SPANS[i0:])
        c.compiles = _COMPILES[0] - n0


def best_time(fn: Any, *args: Any, repeats: int = 5, number: int = 1) -> tuple[float, float]:
    """(min, median) seconds of `fn(*args)` (blocked until ready) over `repeats` timings
    of `number` calls each, after one untimed warm-up call. The minimum is the figure least
    disturbed by other processes on a shared machine."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / number)
    times.sort()
    return times[0], times[len(times) // 2]


# --- targets -----------------------------------------------------------------------------


def fills_cache_untimed(smoke: bool, repeats: int) -> bool:
    """Whether an untimed process fills each side's compilation cache before the timed
    cold and warm ones. A smoke run with one repeat skips it: its cold process, given the
    still-empty folder, compiles everything (a cold figure still) and fills it for the warm
    one, one process fewer per side."""
    return not smoke or repeats > 1


def cache_for(kind: str, folder: str, filled_untimed: bool) -> str | None:
    """The cache folder a timed process gets: `folder` when `kind` is "warm", and when no
    untimed process filled it (the cold one fills it then); otherwise none (cold)."""
    return folder if kind == "warm" or not filled_untimed else None


def cache_dir() -> Path:
    path = Path(
        os.environ.get("ENSEMBLENN_BENCH_CACHE", Path.home() / ".cache" / "ensemblenn-benchmarks")
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


def gaussian(dim: int = 100, condition_number: float = 100.0) -> Any:
    """gauss100: diagonal Gaussian, variances logspace(0, 2, dim) (condition number 100)."""
    import samplers

    return samplers.targets.IllConditionedGaussian(dim=dim, condition_number=condition_number)


def logistic(num_data: int = 1000, num_features: int = 50, num_draws: int = 200_000) -> Any:
    """logreg50: `samplers.targets.LogisticRegression` with reference moments by importance
    sampling (multivariate-t proposal, 20 dof), cached on disk."""
    import numpy as np

    import samplers

    base = samplers.targets.LogisticRegression(num_data=num_data, num_features=num_features)
    path = cache_dir() / f"logreg_{num_data}x{num_features}_seed0_is{num_draws}_t20.npz"
    if path.exists():
        saved = np.load(path)
        ref = samplers.targets.Moments(saved["mean"], saved["second"], saved["second_var"])
    else:
        import jax

        ref = base.compute_reference(num_draws, jax.random.key(20260101), dof=20)
        np.savez(
            path,
            mean=np.asarray(ref.mean),
            second=np.asarray(ref.second_moment),
            second_var=np.asarray(ref.second_moment_var),
        )
    return samplers.targets.LogisticRegression(
        num_data=num_data, num_features=num_features, reference=ref
    )


def closed_over_logdensity(target: Any) -> Any:
    """The target's log density as a plain function closing over its data arrays (the way
    users write it for BlackJAX); ensemblenn lifts the captured arrays into operands."""
    import jax.numpy as jnp

    import samplers

    if isinstance(target, samplers.targets.LogisticRegression):
        X, y = jnp.asarray(target.X), jnp.asarray(target.y)

        def logdensity(w):
            logits = X @ w
            return (
                jnp.sum(y * logits - jnp.logaddexp(0.0, logits))
                - 0.5 * jnp.sum(w**2)
                - 0.5 * w.shape[0] * math.log(2 * math.pi)
            )

        return logdensity
    variances = jnp.asarray(target.variances)

    def logdensity(x):
        return -0.5 * jnp.sum(x**2 / variances + jnp.log(variances) + math.log(2 * math.pi))

    return logdensity


# --- bias trajectories -------------------------------------------------------------------


def grads_to_stay_below(
    grads: Sequence[float], b2: Sequence[float], threshold: float
) -> float | None:
    """Gradient evaluations per chain after which `b2` stays below `threshold` until the
    end of the trajectory; None if its last value is not below."""
    import numpy as np

    grads, b2 = np.asarray(grads, float), np.asarray(b2, float)
    if b2.size == 0 or not b2[-1] < threshold:
        return None
    above = np.nonzero(~(b2 < threshold))[0]
    first = 0 if above.size == 0 else above[-1] + 1
    return float(grads[first])


def iid_floor(
    reference: Any, num_chains: int, num_samples: int = 400, seed: int = 0
) -> tuple[float, float]:
    """Median (b²_max, b²_mean) of the ensemble estimate of E[x²] from `num_chains` exact
    Gaussian-moment draws: the noise floor of the per-step metric. Uses Var[x²] only (the
    estimate's error is ~ N(0, Var[x²] / n)), so b²_i ~ chi²_1 / n."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dim = int(np.shape(reference.second_moment)[0])
    z = rng.standard_normal((num_samples, dim)) ** 2 / num_chains
    return float(np.median(z.max(axis=1))), float(np.median(z.mean(axis=1)))
