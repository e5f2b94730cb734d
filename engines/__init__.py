"""Checkpoint engine plug-ins: one module each, named in configs/engines/<name>.yaml."""
