"""Reports from result files, with matplotlib only (docs/analysis.md): `load` reads runs, `table` makes rows and
groups of repeats, `plots` and `panels` draw figures, `render` writes Markdown and HTML, `report` is the command."""
