"""Generated launch scripts -> running ranks: the phase orchestration, page-cache control, host facts."""
