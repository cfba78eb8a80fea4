"""Diagnostics and experiments run from a clone (``python -m tools.<name>``); the product
(``vla_envs``, ``vla_trainer``, ``real_robot``, ``calibration``) never imports them."""
