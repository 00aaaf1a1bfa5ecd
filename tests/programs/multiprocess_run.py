"""One process of a (possibly multi-process) `samplers.run`, for tests/test_multiprocess.py.

Usage: python multiprocess_run.py NUM_PROCESSES PROCESS_ID PORT LOCAL_DEVICES OUT_DIR MESH

With NUM_PROCESSES = 1 it runs alone on LOCAL_DEVICES simulated devices; otherwise it joins
the others on 127.0.0.1:PORT. MESH is "auto" or "explicit". It runs the ensemble of
`make_run` in tests/test_multiprocess.py twice: straight through, and interrupted after its
first checkpoint then resumed; process 0 writes both outcomes to OUT_DIR/{plain,resumed}.npz.
It fails if any TCP socket it listens on is not on the loopback.
"""

import os
import sys

num_processes, process_id, port, local_devices = map(int, sys.argv[1:5])
out_dir, mesh_kind = sys.argv[5], sys.argv[6]
os.environ["JAX_PLATFORMS"] = "cpu"

import ensemblenn.distributed as dist  # noqa: E402  (imports jax, starts no backend)

if num_processes > 1:
    dist.initialize(num_processes, process_id, port, local_device_count=local_devices, timeout=90)
else:
    import jax

    jax.config.update("jax_num_cpu_devices", local_devices)

import jax  # noqa: E402
import numpy as np  # noqa: E402


def listening_addresses() -> list[str]:
    """The local addresses of the TCP sockets THIS process listens on (Linux /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, ours
                    address, port = fields[1].split(":")
                    raw = bytes.fromhex(address)
                    if len(raw) == 4:
                        host = ".".join(str(b) for b in raw[::-1])
                    else:  # IPv6: four little-endian 32-bit words
                        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
                        host = "[" + b"".join(words).hex() + "]"
                    found.append(f"{host}:{int(port, 16)}")
    return found


import samplers  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "samplers", "checkpoint"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # `tests.` helpers
from test_multiprocess import make_run, outcome  # noqa: E402

assert jax.device_count() == 4, jax.devices()
sampler, target, positions, kwargs = make_run(mesh_kind)
plain = outcome(samplers.run(sampler, target, positions, **kwargs))
if num_processes > 1:  # the coordinator and gloo listen on the loopback only
    listening = listening_addresses()
    print(f"process {process_id} listens on {listening}", flush=True)
    loopback = ("127.", "[00000000000000000000ffff7f", "[00000000000000000000000000000001]")
    assert all(a.startswith(loopback) for a in listening), listening


class Interrupt(Exception):
    pass


save = samplers.checkpoint.Checkpointer.save


def save_then_stop(self, snapshot, total):
    save(self, snapshot, total)
    raise Interrupt  # as if the job were preempted right after its first checkpoint


folder = os.path.join(out_dir, "checkpoint")
samplers.checkpoint.Checkpointer.save = save_then_stop
try:
    samplers.run(sampler, target, positions, checkpoint_dir=folder, checkpoint_every=20, **kwargs)
    raise SystemExit("the run was not interrupted")
except Interrupt:
    pass
samplers.checkpoint.Checkpointer.save = save
resumed_result = samplers.run(
    sampler, target, positions, checkpoint_dir=folder, checkpoint_every=20, resume=True, **kwargs
)
resumed = outcome(resumed_result)
resumed_result.summary()  # printed by process 0 only
if dist.is_main_process():
    np.savez(os.path.join(out_dir, "plain.npz"), **plain)
    np.savez(os.path.join(out_dir, "resumed.npz"), **resumed)
print(f"process {process_id} done", flush=True)
if num_processes > 1:
    dist.shutdown()
