"""Task families built on the simulator backends: task data plus a few functions."""
