"""The policy interface the rollout and the trainer use: env observations in, action chunks out.

    policy = VLAPolicy(model, tokenizer, unnorm_key="identity")
    sample = policy.act(obs, temperature=1.0, top_k=50)        # rollout, no grad
    env.chunk_step(sample.actions.numpy())                       # [N, C, 7] in [-1, 1]
    ...
    ev = policy.evaluate(sample.inputs, sample.action_token_ids, temperature=1.0, top_k=50)
    ratio = (ev.log_probs - sample.log_probs).exp()              # [N, C, 7]; 1 before any update

The observation is vla_envs' dict: ``"image"`` uint8 ``[N, H, W, 3]`` and ``"instruction"``
(``N`` strings); ``"state"`` (float ``[N, S]``) only by a model with ``proprio_dim = S``;
``"wrist_image"`` is not used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
import torch

from .action_tokenizer import action_stats_tensors, gripper_to_contract, resolve_unnorm_key, unnormalize_actions
from .errors import InvalidInputError
from .tokenizer import check_tokenizer, tokenize_prompts
from .vision import images_to_pixel_values


@dataclass
class PolicyInputs:
    """Model-ready tensors of a batch of observations (what a rollout buffer stores).

    Shapes:
        pixel_values: float32 ``[N, 6, H, W]``.
        input_ids: int64 ``[N, T]`` prompts without BOS, left-padded.
        attention_mask: bool ``[N, T]``.
        proprio: float32 ``[N, S]`` robot state, or None for a model that reads none.
    """

    pixel_values: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    proprio: torch.Tensor | None = None

    def _map(self, fn) -> PolicyInputs:
        return PolicyInputs(*(None if (v := getattr(self, f.name)) is None else fn(v) for f in fields(self)))

    def to(self, device) -> PolicyInputs:
        return self._map(lambda v: v.to(device))

    def __getitem__(self, index) -> PolicyInputs:
        """Rows ``index`` (a slice, int64 or bool tensor) of every field, e.g. a minibatch."""
        return self._map(lambda v: v[index])


@dataclass
class ActionSample:
    """What ``act`` returns.

    Shapes:
        actions: float32 ``[N, C, 7]``, un-normalised, in the env's ``[-1, 1]`` convention.
        action_token_ids: int64 ``[N, C, 7]``.
        log_probs: float32 ``[N, C, 7]`` per token, under the sampling temperature / top-k.
        values: float32 ``[N, V]`` (V = 1 chunk-level, C action-level) or None.
        inputs: the model inputs the sample was drawn from.
    """

    actions: torch.Tensor
    action_token_ids: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor | None
    inputs: PolicyInputs


@dataclass
class ActionEvaluation:
    """What ``evaluate`` returns (differentiable).

    Shapes:
        log_probs, entropy: float32 ``[N, C, 7]``; values: float32 ``[N, V]`` or None.
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None


class Policy(Protocol):
    """What rollout and training need from a VLA policy."""

    chunk_size: int
    action_dim: int

    def prepare(self, obs: Mapping[str, Any]) -> PolicyInputs: ...

    def act(
        self,
        obs: Mapping[str, Any] | PolicyInputs,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionSample: ...

    def evaluate(
        self,
        inputs: PolicyInputs,
        action_token_ids: torch.Tensor,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> ActionEvaluation: ...

    def param_groups(self, lr: float, value_lr: float) -> list[dict]: ...


def unwrap(model):
    """The OpenVLA model under a peft wrapper (LoRA layers stay injected), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def param_groups(model, lr: float, value_lr: float) -> list[dict]:
    """Optimizer groups: the value head gets its own learning rate (RLinf: 1e-4 vs 3e-3).

    Only parameters with ``requires_grad`` are included (with LoRA: adapters + value head).
    """
    policy, value = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (value if "value_head." in name else policy).append(p)
    groups = [{"name": "policy", "params": policy, "lr": lr}]
    if value:
        groups.append({"name": "value_head", "params": value, "lr": value_lr})
    return groups


def check_images(images: Any, image_size: int, n: int, key: str = "image") -> torch.Tensor:
    """uint8 ``[n, image_size, image_size, 3]`` as a tensor, or InvalidInputError saying what is wrong."""
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(np.require(images, requirements=["C", "W"]))  # Ray hands read-only arrays
    if not isinstance(images, torch.Tensor):
        raise InvalidInputError(
            f"obs[{key!r}] must be a numpy array or torch tensor, got {type(images).__name__}"
        )
    expected = (n, image_size, image_size, 3)
    if images.dtype != torch.uint8:
        raise InvalidInputError(f"obs[{key!r}] must be uint8 RGB {list(expected)}, got dtype {images.dtype}")
    if tuple(images.shape) != expected:
        raise InvalidInputError(
            f"obs[{key!r}] must be uint8 {list(expected)} (N, H, W, RGB at the model's {image_size} px), "
            f"got shape {list(images.shape)}; render the camera at {image_size}x{image_size} or resize first"
        )
    return images


def check_state(state: Any, width: int, n: int) -> torch.Tensor:
    """float32 ``[n, width]`` robot state as a tensor, or InvalidInputError saying what is wrong."""
    if state is None:
        raise InvalidInputError(f"this model reads the robot state: obs['state'] must be float [{n}, {width}], "
                                "and the observation has none")
    state = torch.as_tensor(np.asarray(state, dtype=np.float32))
    if tuple(state.shape) != (n, width):
        raise InvalidInputError(f"obs['state'] must be float [{n}, {width}] (the model's proprio_dim={width}), "
                                f"got shape {list(state.shape)}")
    if not torch.isfinite(state).all():
        raise InvalidInputError("obs['state'] holds NaN or inf")
    return state


class VLAPolicy:
    """OpenVLA or OpenVLA-OFT (optionally LoRA-wrapped) behind the ``Policy`` interface.

    Args:
        model: ``OpenVLAForActionPrediction`` / ``OpenVLAOFTForActionPrediction`` or a peft model of one.
        tokenizer: the checkpoint's tokenizer (Llama-2's, or the tiny presets' byte tokenizer).
        unnorm_key: which action statistics to un-normalise with; may be None if there is one.
        clip_actions: clip un-normalised actions to ``[-1, 1]`` (the env's action space).

    Raises:
        UnknownUnnormKeyError: ``unnorm_key`` is not in the model's ``norm_stats`` (lists them).
        ConfigMismatchError: the tokenizer does not belong to the model.
    """

    def __init__(self, model, tokenizer, unnorm_key: str | None = None, clip_actions: bool = True):
        self.model = model
        self.core = unwrap(model)
        self.config = self.core.config
        check_tokenizer(tokenizer, self.config)
        self.tokenizer = tokenizer
        self.unnorm_key = resolve_unnorm_key(self.config.norm_stats, unnorm_key)
        self.q01, self.q99, self.mask = action_stats_tensors(
            self.config.norm_stats, self.unnorm_key, self.config.action_dim
        )
        self.clip_actions = clip_actions
        self.chunk_size = self.config.chunk_size
        self.action_dim = self.config.action_dim

    @property
    def device(self) -> torch.device:
        return self.core.device

    def prepare(self, obs: Mapping[str, Any]) -> PolicyInputs:
        """Validates an observation dict and turns it into model inputs.

        Raises:
            InvalidInputError: a key is missing, the images have the wrong dtype/shape, an
                instruction is empty, or a model that reads the robot state gets none or the
                wrong width.
        """
        if not isinstance(obs, Mapping) or "image" not in obs or "instruction" not in obs:
            raise InvalidInputError(
                "obs must be a dict with 'image' (uint8 [N, H, W, 3]) and 'instruction' (N strings)"
            )
        instructions = obs["instruction"]
        if isinstance(instructions, str):
            raise InvalidInputError(
                "obs['instruction'] must hold one string per env (a tuple), not a single str"
            )
        if not isinstance(instructions, (list, tuple, np.ndarray)):
            raise InvalidInputError(f"obs['instruction'] must hold one string per env (a tuple of N str), got "
                                    f"{type(instructions).__name__}")
        instructions = list(instructions)
        images = check_images(obs["image"], self.config.image_size, len(instructions))
        input_ids, attention_mask = tokenize_prompts(self.tokenizer, instructions, self.config)
        pixel_values = images_to_pixel_values(images, self.config.image_mean, self.config.image_std)
        proprio = None
        if self.config.proprio_dim:
            proprio = check_state(obs.get("state"), self.config.proprio_dim, len(instructions))
        return PolicyInputs(pixel_values, input_ids, attention_mask, proprio).to(self.device)

    def actions_from_tokens(self, action_token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``[N, C, A]`` -> env actions float32 ``[N, C, A]`` (decode, un-normalise, the
        gripper in the envs' convention, clip)."""
        normalized = self.core.action_tokenizer.decode(action_token_ids)
        actions = unnormalize_actions(normalized, self.q01, self.q99, self.mask)
        actions = gripper_to_contract(actions, self.config.action_gripper)
        return actions.clamp(-1.0, 1.0) if self.clip_actions else actions

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Any] | PolicyInputs,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionSample:
        """Samples (or, with ``greedy``, takes the most likely) action chunk for each env."""
        inputs = obs if isinstance(obs, PolicyInputs) else self.prepare(obs)
        out = self.core.sample_actions(
            inputs.pixel_values,
            inputs.input_ids,
            inputs.attention_mask,
            temperature=temperature,
            top_k=top_k,
            greedy=greedy,
            generator=generator,
            proprio=inputs.proprio,
        )
        return ActionSample(
            actions=self.actions_from_tokens(out.token_ids),
            action_token_ids=out.token_ids,
            log_probs=out.log_probs,
            values=out.values,
            inputs=inputs,
        )

    def evaluate(
        self,
        inputs: PolicyInputs,
        action_token_ids: torch.Tensor,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> ActionEvaluation:
        """Recomputes log-probs, entropy and values of ``action_token_ids`` with gradients."""
        log_probs, entropy, values = self.core.evaluate_actions(
            inputs.pixel_values,
            inputs.input_ids,
            inputs.attention_mask,
            action_token_ids.to(self.device),
            temperature=temperature,
            top_k=top_k,
            proprio=inputs.proprio,
        )
        return ActionEvaluation(log_probs, entropy, values)

    def param_groups(self, lr: float, value_lr: float) -> list[dict]:
        return param_groups(self.model, lr, value_lr)
