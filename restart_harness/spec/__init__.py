"""What a run is: every key declared once (keys.py), the RunSpec (runspec.py), the model's shape and parameter table
(model_shape.py, parameters.py), and the resolved run that spec.json holds (run.py). Pure: no torch, no machine."""

from restart_harness.spec.runspec import RunSpec

__all__ = ["RunSpec"]
