"""Benchmarks: ensemblenn/samplers side by side with BlackJAX, NumPyro and emcee.

Run one with ``python -m benchmarks NAME [--devices N[,M...]] [--full] [--smoke]``. Each
prints one JSON line per configuration and a Markdown table at the end. The device count is
fixed per process (``--devices`` sets ``XLA_FLAGS`` before JAX is imported); a list of
device counts runs one subprocess per count and merges their lines. Our side and the peer
always run in the same process, so their ratio is meaningful even on a loaded machine.

Benchmarks (``BENCHMARKS``: name -> (default device counts, description)):

* ``laps``: samplers.LAPS vs BlackJAX LAPS (Auto and Explicit meshes).
* ``overhead``: an MCLMC step through ``enn.ensemble_map`` vs hand-written shard_map+vmap.
* ``floor``: sampler steps vs the bare ``vmap(grad(logdensity))`` over the same chains.
* ``communication``: collectives and the bytes they move per step, from the compiled HLO.
* ``ensemble``: samplers.Stretch vs emcee and NumPyro AIES (stretch move).
* ``nuts``: NumPyro NUTS (4 chains) vs samplers.LAPS with many chains.
* ``scaling``: LAPS time per step and peak memory for 1..8 devices and 64..4096 chains.
* ``blocks``: the cost of ``samplers.run(block_size=k)`` (device-count invariance) vs one
  wide batch per device.
* ``hierarchical``: samplers.LAPS vs BlackJAX LAPS on the eight-schools posterior.
* ``hmc``: samplers.HMC (``samplers.run`` and the bare kernel scan) vs BlackJAX HMC on the
  logistic regression, same step size, leapfrog steps and chains.
* ``accelerator``: ``samplers.run`` with its defaults and in the bitwise mode, the bare kernel
  scan and BlackJAX, time per step for HMC, MALA and NUTS (the GPU table's rows).
* ``kernels``: XLA kernels per step of ``samplers.run`` and of the bare kernel scan,
  counted in the optimized HLO (a CPU-measurable proxy for launches on an accelerator).
* ``first_call``: a fresh process's first LAPS call, ours vs BlackJAX's, with JAX's
  persistent compilation cache off and warm.
* ``smc``: cross-device resampling per scheme, and samplers.SMC vs BlackJAX's adaptive
  tempered SMC (time per particle-mutation, log Z error and its spread over seeds).
* ``workflow``: a NumPyro user's job end to end (fresh process, a NumPyro model):
  samplers.run (NUTS + WindowAdaptation) vs NumPyro's NUTS, cache cold and warm, at equal ESS.
* ``step_parts``: where a ``samplers.run`` step's time goes on an accelerator (moments,
  trace, fixed-order sums switched off one at a time; a probe of the driver's internals).

The peers (``pip install 'ensemblenn[bench]'``) are optional: a benchmark whose peer is not
installed prints a ``skipped`` line for it and still runs our side.
"""

BENCHMARKS: dict[str, tuple[tuple[int, ...], str]] = {
    "laps": ((1, 4), "samplers.LAPS vs BlackJAX LAPS on gauss100 and logreg50"),
    "overhead": ((1, 4), "MCLMC step via enn.ensemble_map vs hand-written shard_map+vmap"),
    "floor": ((1, 4), "sampler step time vs bare vmap(grad(logdensity))"),
    "communication": ((4,), "collectives per step from compiled HLO, 64..4096 chains"),
    "ensemble": ((1,), "samplers.Stretch vs emcee and NumPyro AIES"),
    "nuts": ((4,), "NumPyro NUTS (4 chains) vs samplers.LAPS (many chains)"),
    "scaling": ((1, 2, 4, 8), "LAPS time per step and peak memory vs devices and chains"),
    "blocks": ((1, 4), "samplers.run block_size (device-count invariance) vs one batch"),
    "hierarchical": ((1,), "samplers.LAPS vs BlackJAX LAPS on eight schools (non-centred)"),
    "hmc": ((1,), "samplers.HMC (run, bare kernel) vs BlackJAX HMC on logistic regression"),
    "first_call": ((4,), "a fresh process's first LAPS call vs BlackJAX's, cache cold and warm"),
    "accelerator": ((1,), "samplers.run (defaults, bitwise), bare scan and BlackJAX, per step"),
    "kernels": ((1,), "XLA kernels per step: samplers.run vs the bare kernel scan (from HLO)"),
    "smc": ((4,), "SMC: resampling per scheme; samplers.SMC vs BlackJAX tempered SMC"),
    "workflow": ((4,), "a NumPyro model end to end, fresh process: ours vs NumPyro NUTS"),
    "step_parts": ((1,), "where a samplers.run step's time goes: parts switched off one by one"),
}

__all__ = ["BENCHMARKS"]
