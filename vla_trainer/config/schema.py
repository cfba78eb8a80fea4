"""The typed schema of a training recipe, with the reference's key names.

A recipe is a YAML file whose keys are a subset of these dataclasses' fields (anything else is an
error naming the key); ``load_config`` merges it over the defaults, applies ``key=value``
overrides and calls ``validate`` for the rules types cannot express (choices, divisibility,
granularity combinations).

    cluster.component_placement.{env,rollout,actor}   device sets ("all", "0-3", "0,2")
    runner.*      epochs, evaluation / checkpoint intervals, resume, logging
    algorithm.*   advantage estimator, loss, granularity, PPO/GRPO hyper-parameters, sampling
    env.*         the task and the contract options for training (env.train) and evaluation (env.eval)
    rollout.*     generation: steps per rollout, pipelining, offload
    actor.*       the model, its optimizer, batch sizes
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ComponentPlacement:
    env: str = "all"
    rollout: str = "all"
    actor: str = "all"


@dataclass
class ClusterConfig:
    num_nodes: int = 1
    component_placement: ComponentPlacement = field(default_factory=ComponentPlacement)
    runtime: str = "ray"
    """``ray``: env, rollout and actor workers are Ray actors placed by ``component_placement``;
    ``local``: all three in this process (colocated only; no Ray)."""
    num_devices: Optional[int] = None
    """Device ids per node. None: the visible GPUs, or the usable CPU cores without a GPU. On
    CPU a larger value oversubscribes: device ``d`` runs on core ``d * cores // num_devices``."""
    ray_address: Optional[str] = None
    """An existing Ray cluster (``auto`` or ``host:port``); None: ``RAY_ADDRESS`` if set, else a
    single-node Ray started here and shut down at the end."""
    max_restarts: int = 0
    """Env and rollout workers that may die during the run (in total) and be restarted by Ray: the
    restarted worker gets the current weights and the interrupted rollout or evaluation runs again
    from its seeded resets, so the data equal a run without the death. 0: the first death stops
    the run, naming the worker. Actor workers (the model and optimizer) are never restarted: the
    run stops and ``runner.resume_dir=auto`` continues from the last checkpoint."""


@dataclass
class LoggerConfig:
    log_path: str = "runs"
    experiment_name: str = "default"
    logger_backends: list[str] = field(default_factory=lambda: ["tensorboard"])


@dataclass
class RunnerConfig:
    max_epochs: int = 100
    """Training iterations (one rollout + one update each)."""
    max_wall_minutes: Optional[float] = None
    """Stop (after a checkpoint) once the run has trained this long; None: no limit. The run's total,
    counting the time before a resume: a resumed run of 60 minutes stopped at 40 trains 20 more."""
    val_check_interval: int = 10
    """Evaluate every N iterations (and before the first and after the last); -1: never."""
    save_interval: int = 10
    """Checkpoint every N iterations (and after the last); -1: only at the end."""
    resume_dir: Optional[str] = None
    """A checkpoint folder to resume from, or "auto" for the run folder's latest; None: fresh."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    progress_bar: bool = True


@dataclass
class SamplingParams:
    use_greedy: bool = False
    temperature_train: float = 1.0
    temperature_eval: float = 0.6
    top_k: int = 0
    """0: no top-k truncation (the reference's convention). Else the rollout samples from the top-k
    and the update's log-probs are taken under the same truncation, as the reference does: a token
    that leaves the top-k after an optimizer step has ratio 0 and no gradient (``actor/ratio_min``
    0; it counts 0 in ``actor/approx_kl``). Not with ``kl_beta`` > 0."""


@dataclass
class AlgorithmConfig:
    adv_type: str = "gae"
    """gae (PPO with a critic) | grpo (group-relative, no critic)."""
    loss_type: str = "actor_critic"
    """actor_critic (policy + value loss) | actor (policy loss only; GRPO)."""
    reward_type: str = "chunk_level"
    logprob_type: str = "token_level"
    value_type: Optional[str] = None
    """None: the reward_type."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    normalize_advantages: bool = True
    group_size: int = 1
    """GRPO: envs per group sharing one initial state (env.train.use_fixed_reset_state_ids)."""
    rollout_epoch: int = 1
    """Rollouts collected per update (each from fresh resets); their samples are pooled."""
    update_epoch: int = 1
    """Passes over the pooled rollout data."""
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    value_clip: Optional[float] = 0.2
    huber_delta: Optional[float] = 10.0
    value_loss_coef: float = 1.0
    entropy_bonus: float = 0.0
    kl_beta: float = 0.0
    """Coefficient of a k3 KL penalty to the frozen initial policy; 0: off (no reference copy)."""
    length_normalization: bool = False
    """GRPO: weight each trajectory's steps by 1 / its length so trajectories count equally."""
    success_rate_filter: bool = False
    """GRPO: train only on groups whose trajectories did not all score alike (paper 4.2.2)."""
    filter_low: Optional[float] = None
    """Smallest group-mean score kept (with filter_high); null: drop exactly the groups whose
    trajectories all scored the same (all succeeded or all failed under 0/1 rewards)."""
    filter_high: Optional[float] = None
    """Largest group-mean score kept (with filter_low); null: see filter_low."""
    bc_coef: float = 0.0
    """Weight of a behaviour-cloning term on demonstrations added to every optimizer step (the
    demo-augmented policy gradient of DAPG); 0: off. Not in the reference."""
    bc_demo_dirs: list[str] = field(default_factory=list)
    """``vla-envs collect-demos`` folders the behaviour-cloning term draws from (bc_coef > 0)."""
    bc_batch_size: int = 0
    """Demo samples per optimizer step for the behaviour-cloning term; 0: actor.micro_batch_size."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class EnvSplitConfig:
    task: str = "PutOnPlateInScene25Main-v3"
    total_num_envs: int = 4
    auto_reset: bool = True
    ignore_terminations: bool = False
    use_fixed_reset_state_ids: bool = False
    max_episode_steps: Optional[int] = None
    """None: the task's own limit."""
    reward_coef: float = 1.0
    """Rewards are multiplied by this (the reference's LIBERO recipes use 5.0)."""
    num_episodes: int = 16
    """Evaluation only: episodes per evaluation (a multiple of total_num_envs)."""
    vectorization: str = "pool"
    """pool (a worker process per env) | serial (all in this process)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Passed to gym.make (e.g. low_poly, assets, camera_file, sim_backend)."""


@dataclass
class EnvConfig:
    enable_offload: bool = False
    train: EnvSplitConfig = field(default_factory=EnvSplitConfig)
    eval: EnvSplitConfig = field(default_factory=lambda: EnvSplitConfig(ignore_terminations=True))


@dataclass
class RolloutConfig:
    steps_per_rollout: int = 80
    """Env steps per env per iteration (a multiple of the model's chunk size)."""
    pipeline_stage_num: int = 1
    enable_offload: bool = False


@dataclass
class ModelConfig:
    model_name: str = "openvla_oft"
    """openvla | openvla_oft; a checkpoint at model_path must be of this family (checked at load)."""
    preset: Optional[str] = "tiny-openvla-oft"
    """Build a randomly initialised preset when model_path is None."""
    model_path: Optional[str] = None
    """A saved checkpoint folder (vla-train sft output, vla_trainer.checkpoint.export_merged output)."""
    unnorm_key: Optional[str] = None
    """The dataset statistics that un-normalise actions (a checkpoint with several)."""
    is_lora: bool = False
    """Train LoRA adapters instead of all weights."""
    lora_rank: int = 32
    """Rank of the LoRA adapters."""
    add_value_head: bool = True
    """Build the critic's value head (PPO needs it; GRPO trains none and warns when it is set)."""
    precision: str = "fp32"
    """The dtype the policy trains in: fp32 (a float16 publication is loaded into it)."""


@dataclass
class OptimConfig:
    lr: float = 1.0e-4
    value_lr: float = 3.0e-3
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1.0e-5
    weight_decay: float = 0.0
    """AdamW's (the CPU recipes' values; the paper's recipes set the reference's 1e-8 and 0.01)."""
    clip_grad: float = 10.0
    critic_warmup_steps: int = 0


@dataclass
class ActorConfig:
    global_batch_size: int = 640
    """Samples (chunks) per optimizer step; a rollout's data is split into such batches."""
    micro_batch_size: int = 40
    """Samples per forward/backward; gradients are accumulated over global / micro of them."""
    seed: int = 1234
    enable_offload: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class TrainConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
