"""RL algorithm math for VLA fine-tuning: pure functions on torch tensors.

Nothing here knows about envs, models, optimizers or loggers; every function takes tensors and
returns tensors (or a NamedTuple of tensors) and keeps no state between calls.

Layout (time-major, as CleanRL stores a rollout):

    T   chunks per rollout (one policy call = one chunk)
    N   envs
    C   actions per chunk (``chunk_size``; 1 for OpenVLA)
    A   tokens per action (7 action dims)

    rewards, terminated, truncated, valid   [T, N, C]     what ``chunk_step`` returns, stacked
    log_probs, entropy                      [T, N, C, A]  per token, what the policy returns, stacked
    values                                  [T, N] (chunk_level) or [T, N, C] (action_level)
    per-trajectory quantities (GRPO)        [N]           one trajectory per env
    per-group quantities (GRPO)             [N // group_size]; env ``i`` is in group ``i // group_size``

Chunk-level tensors drop the ``C`` axis; action-level tensors keep it and, where a recursion runs
over time (GAE, first-done masks, GRPO scores), time is the ``T * C`` sub-steps in execution order
(chunk 0 sub-step 0, chunk 0 sub-step 1, ..., chunk 1 sub-step 0, ...).

Modules:
    granularity  reward / log-prob / value granularity (paper Table 1), reductions, broadcasting
    gae          GAE across auto-reset boundaries, chunk- and action-level
    grpo         trajectory scores, group-relative advantages, valid-action mask,
                 length-normalisation weights, success-rate filter
    losses       PPO clipped policy loss, clipped Huber value loss, entropy bonus, k3 KL penalty,
                 critic warm-up
"""

from .gae import GAEOutput, compute_action_level_gae, compute_gae
from .granularity import (
    LOGPROB_TYPES,
    REWARD_TYPES,
    VALUE_TYPES,
    align_values,
    broadcast_advantages,
    logprob_valid_mask,
    reduce_flags,
    reduce_log_probs,
    reduce_rewards,
    validate_granularity,
)
from .grpo import (
    first_done_mask,
    group_advantages,
    length_normalization_weights,
    success_rate_filter,
    trajectory_scores,
    uniform_groups,
)
from .losses import (
    Penalty,
    PolicyLoss,
    ValueLoss,
    actor_should_update,
    entropy_bonus,
    explained_variance,
    huber,
    k3_kl,
    kl_penalty,
    masked_mean,
    ppo_policy_loss,
    value_loss,
)

__all__ = [
    "GAEOutput",
    "LOGPROB_TYPES",
    "REWARD_TYPES",
    "VALUE_TYPES",
    "Penalty",
    "PolicyLoss",
    "ValueLoss",
    "actor_should_update",
    "align_values",
    "broadcast_advantages",
    "compute_action_level_gae",
    "compute_gae",
    "entropy_bonus",
    "explained_variance",
    "first_done_mask",
    "group_advantages",
    "huber",
    "k3_kl",
    "kl_penalty",
    "length_normalization_weights",
    "logprob_valid_mask",
    "masked_mean",
    "ppo_policy_loss",
    "reduce_flags",
    "reduce_log_probs",
    "reduce_rewards",
    "success_rate_filter",
    "trajectory_scores",
    "uniform_groups",
    "validate_granularity",
    "value_loss",
]
