"""Collectives per step, read from the compiled HLO, for 64..4096 chains.

For each workload the per-chain function is wrapped in `enn.ensemble_map`, jitted, lowered
and compiled for the mesh; the optimised HLO text is parsed. Every collective instruction
(all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute, ...) is attributed
to the innermost `while` loop whose body contains it (or to "once" outside loops), so a
loop body's collectives are what one step moves. Bytes are the collective's result size on
one device (for an all-gather, the gathered array).

Workloads:

* `MCLMC step`: one sampling step, no cross-chain statistics (expect no collectives).
* `MCLMC step + b² tracking`: the step plus `enn.chain_mean(x**2)`, what
  `samplers.run(track_bias=True)` adds per step.
* `LAPS adaptation`: `samplers.LAPS.run` (phases 0-2); its phase-1 loop body is one
  unadjusted adaptation step, its phase-2 loop body one step-size tuning step.
* `Stretch step`: the ensemble move gathers every walker's position by design, so its
  bytes grow with the walker count (shown for contrast).

Our reductions (`enn.chain_sum`/`chain_mean`) reduce each device's block first and gather
one partial result per device, so their bytes depend on the device count, not the chains,
as long as each device holds a power-of-two number of chains; otherwise every chain's value
is gathered to keep the summation order fixed (the 96-chain row shows that fallback).
"""

import argparse
import re
from collections import defaultdict
from typing import Any

import jax

import ensemblenn as enn
import samplers

from ._common import emit, gaussian, mesh_for, print_machine

BENCH = "communication"

COLUMNS = [
    ("workload", "workload", ""),
    ("scope", "per", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("collectives", "collectives", "d"),
    ("kinds", "kinds", ""),
    ("bytes", "bytes", "d"),
]

_COLLECTIVES = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)
_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16)\[([\d,]*)\]")
_REFS = re.compile(
    r"\b(body|condition|calls|to_apply|true_computation|false_computation)"
    r"=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")


def _split_type(rest: str) -> tuple[str, str]:
    """`(type, remainder)` of an instruction's right-hand side; tuple types nest parens."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :].lstrip()
    head, _, tail = rest.partition(" ")
    return head, tail


def _bytes(type_text: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(type_text):
        size = 1
        for d in filter(None, dims.split(",")):
            size *= int(d)
        total += size * _DTYPE_BYTES.get(dtype, 4)
    return total


class Hlo:
    """The pieces of an optimised HLO module text this benchmark needs."""

    def __init__(self, text: str):
        self.computations: dict[str, list[tuple[str, str, str]]] = {}
        self.entry = ""
        self.frames: dict[int, str] = {}
        current = None
        for line in text.splitlines():
            header = _HEADER.match(line)
            if header and not line.startswith(" "):
                current = header.group(2)
                self.computations[current] = []
                if header.group(1):
                    self.entry = current
                continue
            if line.startswith("}"):
                current = None
                continue
            if current is None:
                continue
            instr = _INSTR.match(line)
            if instr:
                type_text, rest = _split_type(instr.group(2))
                opcode = rest.split("(", 1)[0].strip()
                self.computations[current].append((opcode, type_text, rest))
        self._parse_frames(text)

    def _parse_frames(self, text: str) -> None:
        section, files, functions, locations, frames = "", {}, {}, {}, {}
        for line in text.splitlines():
            if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
                section = line
                continue
            m = re.match(r"^(\d+)\s+(.*)$", line)
            if not m:
                continue
            key, value = int(m.group(1)), m.group(2)
            if section == "FunctionNames":
                functions[key] = value.strip('"')
            elif section == "FileNames":
                files[key] = value.strip('"')
            elif section == "FileLocations":
                fn = re.search(r"function_name_id=(\d+)", value)
                ln = re.search(r"\bline=(\d+)", value)
                locations[key] = (int(fn.group(1)) if fn else 0, int(ln.group(1)) if ln else 0)
            elif section == "StackFrames":
                loc = re.search(r"file_location_id=(\d+)", value)
                frames[key] = int(loc.group(1)) if loc else 0
        for frame, loc in frames.items():
            fn, line = locations.get(loc, (0, 0))
            self.frames[frame] = f"{functions.get(fn, '?')}:{line}"

    def _own(self, name: str) -> tuple[list[tuple[str, int]], list[tuple]]:
        """Collectives in computation `name` and what it calls, except loop bodies; and the
        while instructions met on the way."""
        collectives, loops, seen = [], [], set()

        def visit(comp: str) -> None:
            if comp in seen or comp not in self.computations:
                return
            seen.add(comp)
            for opcode, type_text, rest in self.computations[comp]:
                base = opcode.removesuffix("-start")
                if base in _COLLECTIVES and not opcode.endswith("-done"):
                    collectives.append((base, _bytes(type_text)))
                if opcode == "while":
                    body = re.search(r"\bbody=%?([\w.\-]+)", rest)
                    trip = _TRIP.search(rest)
                    frame = _FRAME.search(rest)
                    where = self.frames.get(int(frame.group(1)), "?") if frame else "?"
                    loops.append(
                        (body.group(1) if body else "", trip.group(1) if trip else "dynamic", where)
                    )
                    continue
                for kind, ref in _REFS.findall(rest):
                    if kind not in ("body", "condition"):
                        visit(ref)
                for group in _BRANCHES.findall(rest):
                    for ref in group.split(","):
                        visit(ref.strip().lstrip("%"))

        visit(name)
        return collectives, loops

    def summary(self) -> list[dict]:
        """One entry for "once" (outside loops) and one per loop that has collectives."""
        out, queue, done = [], [("once", self.entry, "", "")], set()
        while queue:
            scope, comp, trip, where = queue.pop(0)
            if comp in done:
                continue
            done.add(comp)
            collectives, loops = self._own(comp)
            kinds: dict[str, int] = defaultdict(int)
            for kind, _ in collectives:
                kinds[kind] += 1
            out.append(
                dict(
                    scope=scope,
                    loop_at=where,
                    trip_count=trip,
                    collectives=len(collectives),
                    kinds=", ".join(f"{v}× {k}" for k, v in sorted(kinds.items())),
                    bytes=sum(b for _, b in collectives),
                    shapes=sorted({_shape_of(c) for c in collectives}),
                )
            )
            for body, trip_count, at in loops:
                queue.append(("loop step", body, trip_count, at))
        return out


def _shape_of(collective: tuple[str, int]) -> str:
    return f"{collective[0]}:{collective[1]}B"


def _loop_name(where: str, trips: str) -> str:
    """A readable name for a loop found at `function:line` of the traced source."""
    function = where.split(":")[0]
    known = {"LAPS._phase1": "LAPS phase-1 step", "LAPS.run": "LAPS phase-2 tuning step"}
    name = known.get(function, f"step of the loop at {where}")
    return f"{name} (loop trips: {trips})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--chains", default=None, help="comma-separated chain counts (default 64,256,1024,4096,96)"
    )
    p.add_argument("--dim", type=int, default=None, help="target dimension (default 100)")
    p.add_argument("--workloads", default="mclmc,bias,laps,stretch")


def _compile(fn: Any, *args: Any) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def workloads(target: Any, mesh: Any, chains: int, seed: int, which: set[str]) -> dict:
    """HLO text of each workload for `chains` chains."""
    keys = enn.chain_keys(jax.random.key(seed), chains)
    x0 = jax.random.normal(jax.random.key(seed + 1), (chains, target.dim))
    roles = (None, None, enn.PER_CHAIN, enn.PER_CHAIN)
    kernel = samplers.MCLMC(step_size=0.5, L=5.0)
    init = enn.ensemble_map(
        lambda k, t, x, key: k.init(t, x, key), mesh=mesh, in_roles=roles, out_roles=enn.PER_CHAIN
    )
    state = init(kernel, target, x0, keys)
    texts = {}
    if "mclmc" in which:
        step = enn.ensemble_map(
            lambda k, t, s, key: k.step(t, s, key)[0],
            mesh=mesh,
            in_roles=roles,
            out_roles=enn.PER_CHAIN,
        )
        texts["MCLMC step"] = _compile(lambda s, key: step(kernel, target, s, key), state, keys)
    if "bias" in which:

        def tracked(k: Any, t: Any, s: Any, key: Any) -> tuple:
            s, _ = k.step(t, s, key)
            estimate = enn.chain_mean(s.position**2)
            b2 = samplers.diagnostics.bias_squared(
                estimate, t.reference.second_moment, t.reference.second_moment_var
            )
            return s, b2

        step_b = enn.ensemble_map(
            tracked, mesh=mesh, in_roles=roles, out_roles=(enn.PER_CHAIN, enn.BROADCAST)
        )
        texts["MCLMC step + b² tracking"] = _compile(
            lambda s, key: step_b(kernel, target, s, key), state, keys
        )
    if "laps" in which:
        laps = samplers.LAPS(num_steps1=100, num_adaptation_steps=8)
        laps_init = enn.ensemble_map(
            lambda a, t, x, key: a.initial_state(None, t, x, key),
            mesh=mesh,
            in_roles=roles,
            out_roles=enn.PER_CHAIN,
        )
        s0 = laps_init(laps, target, x0, keys)
        adapt = enn.ensemble_map(
            lambda a, t, s, key: a.run(None, t, s, key),
            mesh=mesh,
            in_roles=roles,
            out_roles=(None, enn.PER_CHAIN, None),
        )
        texts["LAPS adaptation"] = _compile(lambda s, key: adapt(laps, target, s, key), s0, keys)
    if "stretch" in which:
        stretch = samplers.Stretch(a=2.0)
        st_init = enn.ensemble_map(
            lambda k, t, x, key: k.init(t, x, key),
            mesh=mesh,
            in_roles=roles,
            out_roles=enn.PER_CHAIN,
        )
        s0 = st_init(stretch, target, x0, keys)
        move = enn.ensemble_map(
            lambda k, t, s, key: k.step(t, s, key)[0],
            mesh=mesh,
            in_roles=roles,
            out_roles=enn.PER_CHAIN,
        )
        texts["Stretch step"] = _compile(lambda s, key: move(stretch, target, s, key), s0, keys)
    return texts


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    if args.smoke:
        default_chains, dim = "8", 4  # one chain count: every workload compiles per count
    elif args.full:
        default_chains, dim = "64,256,1024,4096,16384,65536,96", 100
    else:
        default_chains, dim = "64,256,1024,4096,96", 100
    dim = args.dim or dim
    counts = [int(c) for c in (args.chains or default_chains).split(",")]
    n = args.num_devices
    mesh = mesh_for(n)
    target = gaussian(dim)
    which = set(args.workloads.split(","))
    records: list[dict] = []
    for chains in counts:
        if chains % n:
            continue
        for workload, text in workloads(target, mesh, chains, args.seed, which).items():
            hlo = Hlo(text)
            for entry in hlo.summary():
                if entry["scope"] != "once" and entry["collectives"] == 0:
                    continue
                label = entry["scope"]
                if label == "loop step":
                    label = _loop_name(entry["loop_at"], entry["trip_count"])
                emit(
                    dict(
                        benchmark=BENCH,
                        workload=workload,
                        scope=label,
                        devices=n,
                        chains=chains,
                        chains_per_device=chains // n,
                        collectives=entry["collectives"],
                        kinds=entry["kinds"] or "-",
                        bytes=entry["bytes"],
                        shapes=entry["shapes"],
                    ),
                    records,
                )
    return records
