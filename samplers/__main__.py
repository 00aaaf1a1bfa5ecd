"""`python -m samplers run ...`: a sampling run from the command line (see `samplers.cli`)."""

import os
import sys

from .cli import EXIT_INTERRUPTED, main

if __name__ == "__main__":
    code = main()
    if code == EXIT_INTERRUPTED:
        # After Ctrl-C the chunks already dispatched still run on XLA's threads, and newer
        # XLA:CPU (jax 0.12) crashes with SIGSEGV tearing them down at interpreter exit.
        # Everything worth keeping is out (the checkpoint saved and unlocked, the message
        # printed), so the process leaves without that teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
