"""Reinforcement learning: collecting rollouts into one preallocated buffer, GAE / GRPO targets, the
PPO / GRPO update (with its optional behaviour-cloning term) and held-out evaluation. The loop that
drives them is ``vla_trainer.runner``; where they run is ``vla_trainer.runtime``."""
