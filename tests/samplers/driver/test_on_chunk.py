"""`samplers.run(on_chunk=...)`: the public seam between chunks (logging, time limits,
tests that stop a run at a chosen step)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers
from tests.compile_counter import counting

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
X0 = jnp.zeros((8, 3))
RUN = dict(key=jax.random.key(5), num_steps=30, num_warmup=10, chunk_size=10, progress=False)


def test_called_after_setup_and_each_chunk_without_changing_the_run():
    calls = []
    seen = samplers.run(samplers.MALA(0.5), TARGET, X0, **RUN,
                        on_chunk=lambda step, total: calls.append((step, total)))  # fmt: skip
    assert calls == [(0, 40), (10, 40), (20, 40), (30, 40), (40, 40)]
    plain = samplers.run(samplers.MALA(0.5), TARGET, X0, **RUN)
    np.testing.assert_array_equal(seen.state.position, plain.state.position)


def test_an_exception_in_it_ends_the_run_as_itself():
    class TimeLimit(Exception):
        pass

    def stop(step, total):
        if step >= 20:
            raise TimeLimit(step)

    with pytest.raises(TimeLimit) as err:
        samplers.run(samplers.MALA(0.5), TARGET, X0, **RUN, on_chunk=stop)
    assert err.value.args == (20,)


def test_ctrl_c_in_it_says_how_far_the_run_got():
    def interrupt(step, total):
        if step >= 30:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as err:
        samplers.run(samplers.MALA(0.5), TARGET, X0, **RUN, on_chunk=interrupt)
    assert err.value.step == 30 and "interrupted at step 30 of 40" in str(err.value.__notes__)


def test_not_callable_is_refused_before_compiling():
    with counting() as compiles, pytest.raises(samplers.SamplerTypeError, match="on_chunk"):
        samplers.run(samplers.MALA(0.5), TARGET, X0, **RUN, on_chunk=5)
    assert len(compiles) == 0
