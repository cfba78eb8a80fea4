"""Simulator and robot backends. Each adapts one simulator to ``vla_envs.core``; import
them lazily (their simulator packages are optional extras)."""
