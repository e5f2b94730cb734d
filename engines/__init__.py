"""Checkpoint engine plug-ins: subclasses of engines.base.Engine (and their CheckpointIO) in the modules of this
package, discovered by engines/registry.py; helpers are modules whose names start with an underscore."""
