"""The PutOnPlate scripted expert behind ``VLAPolicy.act``'s signature: a policy that really
reaches, grasps and carries in the simulation, for tests of what happens around a policy's
grasp (the reach report, grasp-triggered correction hand-overs)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vla_envs.core.backend import env_rows


class ExpertAsPolicy:
    """One expert action per chunk (``chunk_size`` 1); envs in ``idle_envs`` get a zero move
    with the gripper open, so they never grasp."""

    chunk_size = 1

    def __init__(self, env, idle_envs: tuple[int, ...] = ()):
        from vla_envs.tasks.put_on_plate.expert import OPEN, ScriptedExpert

        self.env, self.expert, self.idle, self.open = env, ScriptedExpert(env.num_envs), list(idle_envs), OPEN

    def act(self, obs, temperature, generator):
        actions = self.expert.act(env_rows(self.env.expert_state()))
        actions[self.idle] = 0.0
        actions[self.idle, 6] = self.open
        return SimpleNamespace(actions=torch.as_tensor(actions, dtype=torch.float32)[:, None])
