"""`python -m analysis RUN_OR_SWEEP_DIR... [-o REPORT_DIR]`."""

import sys

from analysis.report import main

sys.exit(main())
