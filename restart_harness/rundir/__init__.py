"""The run directory: what a run writes before anything launches (spec.json, ds_config.json, one launch script per
phase, a batch job's script), its status, and the records its phases claim. A run never reuses another's folder."""
