"""Shims around bugs or missing options in dependencies; each module names the version it addresses and how
to tell when it can be removed."""
