"""The behaviour-cloning term of an RL update (``algorithm.bc_coef``), as in DAPG.

With a sparse reward and few parallel envs most PPO / GRPO updates carry little signal, and the
policy can drift from what its supervised warm start did well. This term adds, to every
optimizer step, ``bc_coef`` times the mean negative log-likelihood of ``bc_batch_size``
demonstration samples' action tokens (``models.token_targets.nll_loss``, the SFT objective), drawn with the
update's seeded generator so that a resumed run draws the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vla_trainer.config.loading import ConfigError
from vla_trainer.config.schema import TrainConfig
from vla_trainer.data import SFTSamples, build_samples
from vla_trainer.models import VLAPolicy
from vla_trainer.models.token_targets import nll_loss, target_token_ids


@dataclass
class DemoBatches:
    """Demonstration samples at the policy's image size and their target action tokens.

    Shapes:
        samples: ``M`` samples (``data.SFTSamples``), images ``[M, S, S, 3]``.
        tokens: int64 ``[M, C, 7]`` action token ids of each sample's action chunk.
    """

    samples: SFTSamples
    tokens: torch.Tensor

    @classmethod
    def load(cls, demo_dirs: list[str], policy: VLAPolicy) -> "DemoBatches":
        """Raises FileNotFoundError / ValueError naming a folder that is not a demo folder or holds no steps."""
        samples = build_samples(demo_dirs, policy.chunk_size, policy.config.image_size)
        return cls(samples, target_token_ids(policy, samples.action_chunk))

    def __len__(self) -> int:
        return len(self.samples)

    def draw(self, batch_size: int, generator: torch.Generator) -> np.ndarray:
        """``batch_size`` sample indices drawn uniformly with replacement, int ``[batch_size]``."""
        return torch.randint(len(self), (batch_size,), generator=generator).numpy()

    def loss(self, policy: VLAPolicy, idx: np.ndarray) -> torch.Tensor:
        """The mean NLL per target token of samples ``idx`` under ``policy`` (differentiable, a scalar)."""
        inputs = policy.prepare(self.samples.obs(idx))
        return nll_loss(policy, inputs, self.tokens[idx].to(policy.device))


def load_bc_demos(cfg: TrainConfig, policy: VLAPolicy) -> DemoBatches | None:
    """The behaviour-cloning term's demonstrations (``algorithm.bc_demo_dirs``) when
    ``algorithm.bc_coef`` > 0, else None.

    Raises:
        ConfigError: a folder that is not a demo folder or holds no steps, naming the key.
    """
    if cfg.algorithm.bc_coef <= 0:
        return None
    try:
        return DemoBatches.load(cfg.algorithm.bc_demo_dirs, policy)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"algorithm.bc_demo_dirs: {e}") from None
