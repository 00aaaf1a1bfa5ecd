"""`python -m samplers run ...`: a sampling run from the command line (see `_cli`)."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
