"""Building the trainer's parts from a recipe: the policy, the envs, the optimizer, the seeds.

Shared by the in-process runtime and the Ray workers, so both build exactly the same things.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .config.loading import ConfigError
from .config.schema import EnvSplitConfig, TrainConfig

MODEL_TYPES = {"openvla": "vla_openvla", "openvla_oft": "vla_openvla_oft"}
"""actor.model.model_name -> the model_type of its checkpoints' config.json."""
PRECISIONS = {"fp32": torch.float32}
"""actor.model.precision -> the dtype the policy is trained in."""


def build_policy(cfg: TrainConfig, resume_model_dir: Path | None = None, device: str | None = None):
    """The policy of ``actor.model`` (from a preset or a saved folder), with value head and LoRA
    as configured, on ``device`` (default: a GPU if present); ``resume_model_dir`` replaces its
    weights with a checkpoint's."""
    from .checkpoint import recorded_unnorm_key
    from .models import VLAPolicy, apply_lora, build_model, load_lora, load_pretrained

    m = cfg.actor.model
    value_type = None
    if m.add_value_head and cfg.algorithm.loss_type == "actor_critic":
        value_type = cfg.algorithm.value_type or cfg.algorithm.reward_type
    torch.manual_seed(cfg.actor.seed)  # a value head missing from a saved model is initialised from this
    full_resume = resume_model_dir is not None and not m.is_lora
    if full_resume:
        model, tokenizer = load_pretrained(resume_model_dir, value_type=value_type)
    elif m.model_path is not None:
        model, tokenizer = load_pretrained(full_model_dir(m.model_path), value_type=value_type)
    else:
        model, tokenizer = build_model(m.preset, seed=cfg.actor.seed, value_type=value_type)
        if tokenizer is None:
            raise ValueError(f"actor.model.preset={m.preset!r} has no built-in tokenizer; set "
                             "actor.model.model_path to a saved checkpoint folder")
    if model.config.model_type != MODEL_TYPES[m.model_name]:
        raise ConfigError(f"actor.model.model_name: {m.model_name!r}, but {m.model_path or resume_model_dir} holds "
                          f"a {model.config.model_type!r} model; set actor.model.model_name="
                          f"{next(k for k, v in MODEL_TYPES.items() if v == model.config.model_type)}")
    model = model.to(PRECISIONS[m.precision])  # a float16 publication trains in the recipe's precision
    if m.is_lora:
        model = load_lora(model, resume_model_dir) if resume_model_dir is not None else apply_lora(model, m.lora_rank)
    model.eval()
    unnorm_key = m.unnorm_key
    if unnorm_key is None and resume_model_dir is not None:  # what the run acted with until now
        unnorm_key = recorded_unnorm_key(resume_model_dir)
    if unnorm_key is None and m.model_path is not None:  # the statistics its fine-tuning acted with
        unnorm_key = recorded_unnorm_key(full_model_dir(m.model_path))
    return VLAPolicy(model.to(device or default_device()), tokenizer, unnorm_key=unnorm_key)


def load_model(path: str | Path):
    """``(model, tokenizer, model_dir)`` of what ``path`` names (``resolve_model_dir``), on the CPU.

    A LoRA run's checkpoint holds adapters only: they are applied to the base model that the
    checkpoint's ``config.yaml`` names (``actor.model.model_path``, or the preset and seed) and
    merged into its weights.

    Raises:
        FileNotFoundError: no model there, or adapters whose base model is not found.
        AdapterMismatchError: the base model found is not the one the adapters were trained on.
    """
    from .checkpoint.model_io import checkpoint_recipe, resolve_model_dir
    from .models import load_pretrained, merge_lora

    model_dir = resolve_model_dir(path)
    if (model_dir / "config.json").is_file():
        return (*load_pretrained(model_dir), model_dir)
    cfg = checkpoint_recipe(model_dir)
    if cfg is None:
        raise FileNotFoundError(f"{model_dir} holds LoRA adapters without the training checkpoint's config.yaml "
                                "beside them, which names their base model; load them with "
                                "vla_trainer.models.load_lora onto that model")
    if cfg.actor.model.model_path is not None:
        try:
            full_model_dir(cfg.actor.model.model_path)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{model_dir} holds LoRA adapters for a base model not found from here "
                                    f"({model_dir.parent / 'config.yaml'}: {e}); run from the folder the training "
                                    "ran in") from None
    policy = build_policy(cfg, resume_model_dir=model_dir, device="cpu")
    return merge_lora(policy.model, inplace=True).eval(), policy.tokenizer, model_dir


def full_model_dir(model_path: str | Path) -> Path:
    """The full model that ``actor.model.model_path`` names: a model folder, or a full fine-tune's
    training checkpoint or run folder (its latest checkpoint), as ``vla-eval --checkpoint`` takes them.

    Raises:
        FileNotFoundError: naming the key: nothing of these there, or LoRA adapters (no base weights).
    """
    from .checkpoint.model_io import resolve_model_dir

    if Path(model_path).is_file() and Path(model_path).name != "latest":  # a run's pointer file is a way in
        raise FileNotFoundError(f"actor.model.model_path={model_path}: {model_path} is a file: a model is a folder "
                                "(config.json, model.safetensors, the tokenizer), a training checkpoint or a run folder")
    try:
        model_dir = resolve_model_dir(model_path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"actor.model.model_path={model_path}: {e}") from None
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"actor.model.model_path={model_path}: {model_dir} holds LoRA adapters, not a model to start from; "
            "merge them into their base with vla_trainer.checkpoint.export_merged (docs/models.md), or continue "
            "their run with runner.resume_dir")
    return model_dir


def default_device() -> str:
    """Where a model runs unless told otherwise: the (current) GPU when there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_env(split: EnvSplitConfig, image_size: int, *, group_size: int = 1, evaluation: bool = False,
             num_envs: int | None = None, first_env_index: int = 0, vectorization: str | None = None,
             expert_start_phase: str | None = None):
    """The vectorized env of ``env.train`` / ``env.eval`` at the model's image size.

    ``num_envs`` / ``first_env_index``: only envs ``[first, first + num_envs)`` of the split (a
    worker's pipeline stage); they start from the initial states the whole batch would give them.
    ``expert_start_phase``: an evaluation that starts every episode where the scripted expert
    enters this phase (``vla-eval --expert-start-phase``: success from there, not the task's).
    """
    import gymnasium as gym

    import vla_envs  # noqa: F401  (registers the ids)
    from vla_envs.registry import get_task

    get_task(split.task)  # unknown id: error with close matches, before any work
    kwargs = dict(split.env_kwargs)
    if evaluation:  # the registry refuses the task's training-only options
        kwargs["evaluation"] = True
    if expert_start_phase is not None:  # a diagnostic, labelled as such: not the task's success rate
        kwargs.update(expert_start_phases=[expert_start_phase], evaluation=False)
    kwargs.update(
        image_size=image_size,
        auto_reset=False if evaluation else split.auto_reset,
        ignore_terminations=split.ignore_terminations,
        use_fixed_reset_state_ids=split.use_fixed_reset_state_ids,
        group_size=1 if evaluation else group_size,
        vectorization=vectorization or split.vectorization,
        first_env_index=first_env_index,
    )
    if split.max_episode_steps is not None:
        kwargs["time_limit"] = split.max_episode_steps
    return gym.make(split.task, num_envs=num_envs or split.total_num_envs, **kwargs)


def iteration_seed(seed: int, iteration: int) -> int:
    """The env reset seed of training iteration ``iteration``."""
    return int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0])


def rollout_key(iteration: int, rollout_epoch: int, k: int) -> int:
    """Index of the ``k``-th rollout of training iteration ``iteration``: it seeds the env resets
    and every env's sampling generator, so a rollout depends on nothing that came before."""
    return iteration * rollout_epoch + k


def make_optimizer(policy, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    o = cfg.actor.optim
    groups = policy.param_groups(o.lr, o.value_lr)
    params = [p for g in groups for p in g["params"]]
    optimizer = torch.optim.AdamW(groups, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                                  weight_decay=o.weight_decay)
    return optimizer, params
