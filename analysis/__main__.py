"""`python -m analysis RUN_OR_SWEEP_DIR... [-o REPORT_DIR]`."""

from analysis.report import main

raise SystemExit(main())
