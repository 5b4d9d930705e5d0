"""The dashboard's plumbing, shared by every page: schema fields as widgets (fields), the starting
scenario and uploads (source), the settings sidebar that turns widgets into `--set` overrides
(settings), runs into a temporary folder (runs) and one-line errors (errors)."""
