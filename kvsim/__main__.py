"""`python -m kvsim` entry point."""

from kvsim.cli import main

raise SystemExit(main())
