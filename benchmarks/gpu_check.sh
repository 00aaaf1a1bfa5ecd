#!/usr/bin/env bash
# The one script for a lent accelerator machine: every row of issue "Accelerators first",
# each step bounded by `timeout` so that one slow step cannot eat the others' time, then one
# Markdown table of the rows that matter (each step's own table is printed above it).
#
#   bash benchmarks/gpu_check.sh                 # from anywhere; PYTHON=... to choose
#   LOGS=/some/folder bash benchmarks/gpu_check.sh   # keep the JSON lines and logs there
#   SMOKE=1 bash benchmarks/gpu_check.sh         # tiny sizes, on a CPU too (to test it)
#
# Steps and their bounds (about 6 minutes in all on an H200, start-up not included; the
# bounds were set from a run of the script there, which took 354 s):
#   accelerator  samplers.run defaults / bitwise mode / bare kernel scan / BlackJAX vmap:
#                HMC, MALA, NUTS at 16384 and 65536 chains (gauss100), HMC and MALA on
#                logreg50                                                        140 s
#   floor        the bare kernels and samplers.run vs vmap(grad) (8192 chains)    40 s
#   first_call   LAPS's first call in a fresh process vs BlackJAX (4096 chains)   90 s
#   ensemble     Stretch vs NumPyro AIES, 4096 walkers, gauss20                   30 s
#   bandwidth    a jitted elementwise pass over 1 GiB                             15 s
#   scaling      LAPS 4096 and 65536 chains, bandwidth against that floor         60 s
#   smc          samplers.SMC vs BlackJAX's adaptive tempered SMC, 16384 particles,
#                100-d conjugate Gaussian, HMC mutations (not yet run on a GPU)     60 s
# Runs on a GPU or a TPU alike. Exits 0 with a message when there is no JAX or no accelerator
# (unless SMOKE=1): the project never needs one.
set -u
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOGS="${LOGS:-$(mktemp -d)}"
mkdir -p "$LOGS"
SMOKE="${SMOKE:-}"
T0=$SECONDS
step() { echo; echo "### [$((SECONDS - T0)) s] $*"; }

step "machine"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv || true
fi
"$PY" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())" \
    || { echo "JAX is not importable with $PY: nothing to run (exit 0)"; exit 0; }
"$PY" -c "import importlib.metadata as m
for n in ('equinox', 'optax', 'numpyro', 'blackjax', 'numpy'):
    try: print(n, m.version(n))
    except m.PackageNotFoundError: print(n, 'not installed')"
# Any accelerator JAX drives (a GPU, or a TPU): the rows are the same programs.
if [ -z "$SMOKE" ] && ! "$PY" -c "import jax, sys; sys.exit(jax.default_backend() == 'cpu')"; then
    echo "JAX has no accelerator backend here (CUDA or TPU plugin missing?): nothing to run (exit 0)"
    exit 0
fi

if [ -n "$SMOKE" ]; then
    SIZE=(--smoke) FLOOR=(--smoke --repeats 2) FIRST=(--smoke --repeats 1)
    ENSEMBLE=(--smoke --repeats 1) SCALING=(--smoke --repeats 1 --chains 64,128)
    SMC=(--smoke)
else
    SIZE=(--full --repeats 2)
    FLOOR=(--full --targets gauss100 --repeats 3)
    FIRST=(--chains 4096 --repeats 1)
    ENSEMBLE=(--walkers 4096 --targets gauss20 --steps 3000 --repeats 2)
    SCALING=(--chains 4096,65536 --repeats 2)
    SMC=(--parts smc --dims 100 --smc-particles 16384 --seeds 2)
fi

# BOUND_SCALE=3 multiplies every bound: they were set on an H200, and a TPU v5e compiles
# several times slower (docs/benchmarks.md §15: four steps stopped at their bounds there).
BOUND_SCALE="${BOUND_SCALE:-1}"
bounded() {  # bounded SECONDS NAME ARGS...: one benchmark, its JSON lines kept
    local limit=$(($1 * BOUND_SCALE)) name=$2
    shift 2
    step "$name (at most $limit s)"
    timeout "$limit" "$PY" -m benchmarks "$name" --devices 1 "$@" 2>&1 | tee "$LOGS/$name.log"
    local status=${PIPESTATUS[0]}
    [ "$status" = 124 ] && echo "!! $name stopped at its $limit s bound"
    grep '^{' "$LOGS/$name.log" >"$LOGS/$name.jsonl" || true
}

bounded 140 accelerator "${SIZE[@]}"
bounded 40 floor "${FLOOR[@]}"
bounded 90 first_call "${FIRST[@]}"
bounded 30 ensemble "${ENSEMBLE[@]}"

step "bandwidth floor: a jitted elementwise pass over 1 GiB (read + write)"
timeout 15 "$PY" - <<'EOF' | tee "$LOGS/bandwidth.jsonl"
import json, time, jax, jax.numpy as jnp
x = jnp.ones((256 * 1024 * 1024 // (64 if jax.default_backend() == "cpu" else 1),), jnp.float32)
f = jax.jit(lambda x: x * 1.0001)
f(x).block_until_ready()
best = float("inf")
for _ in range(10):
    t0 = time.perf_counter()
    f(x).block_until_ready()
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"floor_gb_per_s": 2 * x.nbytes / best / 1e9}))
EOF
bounded 60 scaling "${SCALING[@]}" --no-table
bounded 60 smc "${SMC[@]}"

step "summary"
"$PY" - "$LOGS" <<'EOF'
import json, sys
from pathlib import Path

logs = Path(sys.argv[1])
def lines(name):
    path = logs / f"{name}.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
rows = []
for r in lines("accelerator"):
    if r.get("status") == "ok":
        rows.append((f"{r['sampler']} {r['target']}", r["chains"], r["impl"],
                     f"{r['step_us']:.1f} µs/step", f"{r['ratio']:.2f}x {r['ratio_to']}"))
for r in lines("floor"):
    if r.get("status") == "ok" and r.get("path") in ("ensemble_map(scan)", "samplers.run (whole call)"):
        rows.append((f"floor {r['impl']} {r['target']}", r["chains"], r["path"],
                     f"{r['step_us']:.1f} µs/step", f"{r.get('ratio', float('nan')):.2f}x vmap(grad)"))
for r in lines("first_call"):
    if r.get("status") == "ok":
        rows.append((f"first call {r.get('impl', '')}", r.get("chains", ""), r.get("cache", r.get("path", "")),
                     f"{r.get('first_call_s_min', float('nan')):.2f} s", f"{r.get('vs_blackjax_cold_min', float('nan')):.2f}x BlackJAX cold"))
for r in lines("ensemble"):
    if r.get("status") == "ok":
        rows.append((f"ensemble {r.get('impl', '')} {r.get('target', '')}", r.get("walkers", ""), "",
                     f"{r.get('walker_steps_per_s', float('nan')):.3g} walker-steps/s", ""))
floor = lines("bandwidth")
floor = floor[0]["floor_gb_per_s"] if floor else float("nan")
for r in lines("scaling"):
    if "chain_grads_per_s" in r:
        gbs = r["chain_grads_per_s"] * 4 * 100 * 4 / 1e9  # 4 float32 vectors of 100 per gradient
        rows.append((f"scaling LAPS gauss100", r["chains"], "",
                     f"{r['chain_grads_per_s']:.3g} chain-grads/s", f"{gbs / floor:.3f} of {floor:.0f} GB/s"))
for r in lines("smc"):
    if r.get("status") == "ok" and r.get("part") == "smc":
        rows.append((f"SMC {r['impl']} {r['dim']}-d", r["particles"], f"{r['stages']:.0f} stages",
                     f"{r['us_per_mutation']:.3f} µs/particle-mutation", f"log Z error {r['log_z_error']:+.3f}"))
print("| row | chains | path | figure | ratio |")
print("|---|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(str(c) for c in row) + " |")
EOF
echo "### done in $((SECONDS - T0)) s; logs in $LOGS"
exit 0
