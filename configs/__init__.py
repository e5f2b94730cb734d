"""Data, not code: model presets (configs/models/*.yaml, LlamaConfig field names), shipped with the package."""
