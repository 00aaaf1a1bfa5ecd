"""The command line, `python -m samplers run ...` (`samplers/__main__.py` calls `main`).

One concept per module: `_main` (the arguments, their checks, the run and its exit codes),
`_kernels` (the targets and each `--sampler` with its default tuning), `_report` (what is
printed and written with `--out`).
"""

from ._main import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOT_CONVERGED, main

__all__ = ["main", "EXIT_ERROR", "EXIT_NOT_CONVERGED", "EXIT_INTERRUPTED"]
