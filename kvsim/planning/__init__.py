"""Sizing answers on top of `kvsim.run`: the maximum sustainable rate under an SLO, the cheapest
deployment for a target rate, and parameter sweeps on local processes or a Ray cluster."""
