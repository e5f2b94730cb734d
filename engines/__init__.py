"""Checkpoint engine plug-ins: one module each holding one subclass of engines.base.Engine (and its CheckpointIO),
discovered by engines/registry.py; helpers are modules whose names start with an underscore."""
