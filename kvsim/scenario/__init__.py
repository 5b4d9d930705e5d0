"""What to simulate: the scenario file (schema and validation), model and GPU presets, and the
request stream it describes (synthetic arrivals or a replayed trace)."""
