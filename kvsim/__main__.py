"""`python -m kvsim` entry point: kvsim.guard.main, which sets the guard up before importing the rest."""

from kvsim.guard import main

raise SystemExit(main())
