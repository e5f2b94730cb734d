"""RunSpec -> generated artifacts: ds_config.json and one launch script per phase."""
