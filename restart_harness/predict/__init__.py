"""Predicting a run's save and restart seconds before it runs, and calibrating the model from runs (docs/prediction.md)."""
