"""Reports from result files: tables (CSV, Markdown), plots (PNG) and one self-contained HTML page.

Reads only the files a run writes (summary.json, inventory.json, status.json, sweep.json) and needs only matplotlib:
`load` finds and reads runs, `table` flattens them into rows and groups of repeats, `plots` draws figures,
`render` writes Markdown and HTML, `report` is the command line."""
