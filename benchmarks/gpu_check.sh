#!/usr/bin/env bash
# What a lent accelerator machine has, and, if JAX with CUDA is importable, the `scaling`
# benchmark at 4096..65536 chains with its memory bandwidth use against a measured floor.
#
#   bash benchmarks/gpu_check.sh            # from the repository root; PYTHON=... to choose
#
# Short by design (a few minutes of device time). Exits 0 with a message when there is no
# JAX or no GPU: the project never needs one.
set -u
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "## nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.memory,driver_version \
        --format=csv || true
else
    echo "nvidia-smi: not found"
fi

echo "## python / jax"
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "no $PY on this machine: nothing to run (exit 0)"
    exit 0
fi
"$PY" --version
if ! "$PY" -c "import jax" >/dev/null 2>&1; then
    echo "JAX is not importable with $PY: nothing to run (exit 0)"
    exit 0
fi
"$PY" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__); print(jax.devices())"
if ! "$PY" -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 1)"; then
    echo "JAX has no GPU backend here (CUDA plugin missing?): nothing to run (exit 0)"
    exit 0
fi

echo "## bandwidth floor: a jitted elementwise pass over 1 GiB (read + write)"
"$PY" - <<'EOF' | tee /tmp/gpu_floor.json
import json, time, jax, jax.numpy as jnp
x = jnp.ones((256 * 1024 * 1024,), jnp.float32)  # 1 GiB
f = jax.jit(lambda x: x * 1.0001)
f(x).block_until_ready()
best = min((lambda t0: (f(x).block_until_ready(), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(10))
print(json.dumps({"floor_gb_per_s": 2 * x.nbytes / best / 1e9}))
EOF

echo "## scaling benchmark, 1 device, 4096..65536 chains, gauss100"
"$PY" -m benchmarks scaling --devices 1 --chains 4096,16384,65536 --no-table \
    | tee /tmp/gpu_scaling.jsonl

echo "## bandwidth use vs the floor"
"$PY" - <<'EOF'
import json
floor = json.load(open("/tmp/gpu_floor.json"))["floor_gb_per_s"]
dim = 100
for line in open("/tmp/gpu_scaling.jsonl"):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if "chain_grads_per_s" not in r:
        continue
    # Least traffic per chain-gradient of the 100-d Gaussian: read the position, write the
    # gradient, read/write the momentum: 4 float32 vectors of dim.
    gbs = r["chain_grads_per_s"] * 4 * dim * 4 / 1e9
    print(f"chains={r['chains']:>6}  chain-grads/s={r['chain_grads_per_s']:.3g}  "
          f"~{gbs:.1f} GB/s = {gbs / floor:.2f} of the {floor:.0f} GB/s floor  "
          f"peak MiB={r.get('peak_mib', float('nan')):.1f}")
EOF
exit 0
