"""XLA kernels per step, counted in the compiled programs: `samplers.run` vs the bare kernel.

On an accelerator every kernel in a step's loop body is a launch, so the count is a proxy
for the driver's per-step cost that a CPU-only machine can measure. Each configuration runs
in a child process with `XLA_FLAGS=--xla_dump_to=...`; the parent reads the optimized HLO
XLA wrote and counts, in the body of the step loop (the outermost `while` with the most
work), the instructions that execute as kernels: fusions, custom calls, collectives,
copies and the other non-trivial operations outside fusions. Nested loops (leapfrog steps,
`batch_invariant` blocks, NUTS's tree) count their body once, plus their condition.
Parameters, constants, tuples, bitcasts and optimization barriers are free.

Paths: `samplers.run` with its defaults (one batch per device; every draw kept, with its
per-draw statistics, as the run is small), without a trace (`thin=0`), with
`block_size="auto"` (the bitwise mode, blocks of `num_chains // 8`), the bare
`enn.ensemble_map(scan(kernel.step))` over the same chains, and that scan keeping its
draws as a BlackJAX user's does (`scan` returning each step's position and info). Each run
path is compared with the bare path that does the same work: keeping draws or not. The goal
(issue "Accelerators first"): the driver within 1.5x of the bare kernel's count.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import emit, print_machine

BENCH = "kernels"

COLUMNS = [
    ("sampler", "sampler", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("backend", "backend", ""),
    ("path", "path", ""),
    ("kernels_per_step", "kernels / step", "d"),
    ("loops", "nested loops", "d"),
    ("ratio", "ratio to bare", ".2f"),
    ("bare", "bare path compared", ""),
]

SAMPLERS = ("mala", "hmc", "nuts", "mclmc")
PATHS = (
    "run (defaults)",
    "run (thin=0)",
    "run (bitwise blocks)",
    "bare ensemble_map(scan)",
    "bare scan, draws kept",
)
# The bare path doing the same work as each run path (draws kept or not).
COMPARED = {
    "run (defaults)": "bare scan, draws kept",
    "run (thin=0)": "bare ensemble_map(scan)",
    "run (bitwise blocks)": "bare scan, draws kept",
}
FREE = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "opt-barrier",
    "after-all",
    "partition-id",
    "replica-id",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="default 64 (--full 4096)")
    p.add_argument("--dim", type=int, default=20)
    p.add_argument("--samplers", default=",".join(SAMPLERS))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)


# --- the workload, in the child ------------------------------------------------------------


def _kernel(name: str, dim: int) -> Any:
    import jax.numpy as jnp

    import samplers

    variances = jnp.linspace(1.0, 10.0, dim)
    if name == "mala":
        return samplers.MALA(step_size=0.3)
    if name == "hmc":
        return samplers.HMC(
            step_size=0.3, num_integration_steps=10, inverse_mass_matrix=variances, jitter=False
        )
    if name == "nuts":
        return samplers.NUTS(step_size=0.5, inverse_mass_matrix=variances)
    if name == "mclmc":
        return samplers.MCLMC(step_size=0.5, L=3.0)
    raise SystemExit(f"--samplers: unknown sampler {name!r}; choose from {SAMPLERS}")


def _child(spec: dict) -> None:
    import warnings

    import jax
    import jax.numpy as jnp

    import ensemblenn as enn
    import samplers

    warnings.simplefilter("ignore")
    chains, dim, steps = spec["chains"], spec["dim"], 10
    variances = jnp.linspace(1.0, 10.0, dim)

    def logdensity(x: Any) -> Any:
        return -0.5 * jnp.sum(x * x / variances)

    kernel = _kernel(spec["sampler"], dim)
    x0 = jax.random.normal(jax.random.key(0), (chains, dim))
    if spec["path"].startswith("run"):
        block = "auto" if spec["path"] == "run (bitwise blocks)" else None
        thin = {"thin": 0} if spec["path"] == "run (thin=0)" else {}
        result = samplers.run(
            kernel, logdensity, x0, key=jax.random.key(1), num_steps=steps,
            progress=False, block_size=block, **thin,
        )  # fmt: skip
        jax.block_until_ready(result.state.position)
        return

    keep = spec["path"] == "bare scan, draws kept"

    def chain(position: Any, key: Any) -> Any:
        state = kernel.init(logdensity, position, key)

        def body(s: Any, k: Any) -> Any:
            s, info = kernel.step(logdensity, s, k)
            return s, ((s.position, info) if keep else None)

        final, draws = jax.lax.scan(body, state, jax.random.split(key, steps))
        return (final.position, draws) if keep else final.position

    keys = enn.chain_keys(jax.random.key(1), chains)
    out = enn.ensemble_map(chain, in_roles=enn.PER_CHAIN)(x0, keys)
    jax.block_until_ready(out)


# --- reading the optimized HLO ---------------------------------------------------------------

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(
    r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def _opcode(rhs: str) -> str:
    """The opcode of an instruction's right-hand side `TYPE opcode(operands), attrs`."""
    if rhs.startswith("("):  # a tuple type: drop it, up to its closing parenthesis
        depth = 0
        for end, ch in enumerate(rhs):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                rhs = rhs[end + 1 :]
                break
    match = re.match(r"\S*\s+([\w\-]+)\(", rhs)
    if match is None:
        match = re.search(r"\s([\w\-]+)\(", rhs)
    return match.group(1) if match else "?"


def parse_hlo(text: str) -> dict[str, list[tuple[str, dict]]]:
    """Computation name -> its instructions as `(opcode, called computations)`."""
    computations: dict[str, list] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and "=" not in line.split("{")[0].split("(")[0]:
                current = header.group(1)
                computations[current] = []
            continue
        if line.strip() == "}":
            current = None
            continue
        if " = " not in line:
            continue
        rhs = line.split(" = ", 1)[1]
        called = {k: v for k, v in _CALLED.findall(rhs)}
        branches = _BRANCHES.search(rhs)
        if branches:
            called["branches"] = [b.strip().lstrip("%") for b in branches.group(1).split(",")]
        computations[current].append((_opcode(rhs), called))
    return computations


def count(computations: dict, name: str) -> tuple[int, int]:
    """`(kernels, nested loops)` that one execution of computation `name` launches, each
    nested loop's body and condition counted once."""
    kernels = loops = 0
    for opcode, called in computations.get(name, []):
        if opcode in FREE:
            continue
        if opcode == "while":
            k_body, l_body = count(computations, called["body"])
            k_cond, l_cond = count(computations, called["condition"])
            kernels, loops = kernels + k_body + k_cond, loops + 1 + l_body + l_cond
        elif opcode == "conditional":
            names = called.get("branches") or [
                called[k] for k in ("true_computation", "false_computation") if k in called
            ]
            parts = [count(computations, b) for b in names]
            kernels += 1 + max((p[0] for p in parts), default=0)
            loops += max((p[1] for p in parts), default=0)
        elif opcode == "call":
            k, n = count(computations, called["to_apply"])
            kernels, loops = kernels + k, loops + n
        else:
            kernels += 1
    return kernels, loops


def step_loop(folder: Path) -> tuple[int, int]:
    """`(kernels, nested loops)` per step of the step loop: of every outermost `while` in
    the optimized programs XLA dumped, the one with the most kernels."""
    best = (0, 0)
    for path in folder.glob("*after_optimizations.txt"):
        computations = parse_hlo(path.read_text())
        inner = set()
        for instructions in computations.values():
            for opcode, called in instructions:
                if opcode == "while":
                    inner |= _reachable(computations, called["body"])
        for name, instructions in computations.items():
            if name in inner:
                continue
            for opcode, called in instructions:
                if opcode == "while":
                    k_body, l_body = count(computations, called["body"])
                    k_cond, l_cond = count(computations, called["condition"])
                    best = max(best, (k_body + k_cond, l_body + l_cond))
    return best


def _reachable(computations: dict, name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for _, called in computations.get(n, []):
            for v in called.values():
                todo.extend(v if isinstance(v, list) else [v])
    return seen


# --- the parent ------------------------------------------------------------------------------


def measure(spec: dict) -> tuple[int, int]:
    """Run one configuration in a child process and count its step loop's kernels."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ)
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_dump")]
        env["XLA_FLAGS"] = " ".join(flags + [f"--xla_dump_to={folder}", "--xla_dump_hlo_as_text"])
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # a cached program is not dumped
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "benchmarks.kernels", json.dumps(spec)]
        subprocess.run(cmd, check=True, env=env, cwd=root, stdout=subprocess.DEVNULL)
        return step_loop(Path(folder))


def run(args: argparse.Namespace) -> list[dict]:
    import jax

    print_machine(BENCH)
    chains = args.chains or (4096 if args.full else 64)
    names = [s.strip() for s in args.samplers.split(",") if s.strip()]
    if args.smoke:
        chains, names = 8, ["mala"]
    records: list[dict] = []
    for name in names:
        counts = {}
        for path in PATHS:
            spec = dict(sampler=name, path=path, chains=chains, dim=args.dim)
            counts[path] = measure(spec)
        for path in PATHS:
            kernels, loops = counts[path]
            compared = COMPARED.get(path, path)
            emit(
                dict(
                    benchmark=BENCH, sampler=name, devices=args.num_devices, chains=chains,
                    backend=jax.default_backend(), path=path, kernels_per_step=kernels,
                    loops=loops, ratio=kernels / max(counts[compared][0], 1), bare=compared,
                ),
                records,
            )  # fmt: skip
    return records


if __name__ == "__main__":  # the child: python -m benchmarks.kernels '<spec json>'
    _child(json.loads(sys.argv[1]))
