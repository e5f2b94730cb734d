"""Per-rank worker: started by the launcher once per rank and phase."""
