"""The trainer's command lines: ``vla-train`` (``train``: RL, SFT and warm-start stages) and
``vla-eval`` (``eval``: held-out evaluation of any checkpoint)."""
