"""The checkpoint planner: RunSpec -> the files, bytes, writers and restart reads of one checkpoint, without torch."""
