#!/usr/bin/env python3
"""Entry point (./submit-job.sh runs it): `[COMMAND] MODEL key=value ...`; see restart_harness/cli.py."""

import sys

from restart_harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
