"""`python -m samplers run ...`: a sampling run from the command line (see `_cli`)."""

from ._cli import main

raise SystemExit(main())
