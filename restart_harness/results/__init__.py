"""Event records -> inventory and summary files, and the terminal table."""
