"""Every error and warning the packages export shows its public name: tracebacks, pickles
and the docs pages read `samplers.SamplerError`, not the private module defining it."""

import pickle
import traceback

import pytest

import ensemblenn as enn
import samplers

EXPORTED = [
    (package, name, getattr(package, name))
    for package in (enn, samplers)
    for name in package.__all__
    if isinstance(getattr(package, name), type)
    and issubclass(getattr(package, name), (Exception, Warning))
]


def test_some_are_exported():
    names = {name for _, name, _ in EXPORTED}
    assert {"EnsembleError", "RoleError", "SamplerError", "PositionsError"} <= names
    assert {"CheckpointMismatchError", "ConvergenceWarning", "PrecisionWarning"} <= names


@pytest.mark.parametrize("package, name, cls", EXPORTED, ids=[n for _, n, _ in EXPORTED])
def test_shown_by_its_public_name(package, name, cls):
    assert f"{cls.__module__}.{cls.__qualname__}" == f"{package.__name__}.{name}"
    line = traceback.format_exception_only(cls("message"))[0]
    assert line.startswith(f"{package.__name__}.{name}: message")
    assert type(pickle.loads(pickle.dumps(cls("message")))) is cls
