"""What a run is: every key declared once (keys.py), the RunSpec (runspec.py), the model's shape and parameter table
(model_shape.py, parameters.py), and the record of a run that spec.json holds (record.py). Pure: no torch, no
machine."""
