"""OpenVLA as a policy: image + prompt -> 7 discrete action tokens, decoded token by token.

Tensor-level API (the policy in policy.py turns env observations into these tensors):

* ``sample_actions(pixel_values, input_ids, attention_mask, ...)``: rollout / eval; returns
  action token ids, their log-probs at the sampling temperature/top-k, and values.
* ``evaluate_actions(..., action_token_ids, ...)``: training; recomputes log-probs, entropy
  and values for given tokens with the same temperature/top-k (teacher forcing, one pass).
* ``forward(...)``: the raw pass under both: action logits ``[N, C, A, n_bins]`` and values.

``input_ids`` are the tokenized prompts WITHOUT the BOS token, left-padded; the model builds
``[BOS, image patches, prompt]`` itself, inserting the patches after BOS as OpenVLA does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, LlamaForCausalLM, PreTrainedModel
from transformers.utils import ModelOutput

from .action_tokenizer import ActionTokenizer
from .config import OpenVLAConfig, check_autoregressive
from .errors import ConfigMismatchError, InvalidInputError
from .masks import attention_bias, decode_step_bias, position_ids_from_mask
from .sampling import check_sampling_args, log_prob_and_entropy, processed_logits, sample_indices
from .value_head import ValueHead
from .vision import FusedProjector, FusedVisionBackbone, sincos_patch_code


@dataclass
class VLAOutput(ModelOutput):
    """Output of ``forward``.

    Shapes:
        action_logits: float32 ``[N, C, A, n_bins]`` (index ``j`` = token ``first_action_id + j``).
        values: float32 ``[N, V]`` (V = 1 chunk-level, C action-level) or None without a value head.
        hidden_states: ``[N, K, D]`` last-layer states of the whole sequence, if requested.
        prefix_length: ``L``, the number of ``[BOS, patches, prompt]`` columns.
    """

    action_logits: torch.Tensor | None = None
    values: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    prefix_length: int | None = None


@dataclass
class SampledActionTokens(ModelOutput):
    """Output of ``sample_actions``.

    Shapes:
        token_ids: int64 ``[N, C, A]`` vocabulary ids of the action tokens.
        log_probs: float32 ``[N, C, A]`` under the sampling distribution (temperature, top-k).
        values: float32 ``[N, V]`` or None.
    """

    token_ids: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None


class OpenVLAForActionPrediction(PreTrainedModel):
    """OpenVLA (DINOv2 + SigLIP -> projector -> Llama-2) with an optional value head.

    Submodule names follow the official checkpoint (``vision_backbone``, ``projector``,
    ``language_model``), whose timm-named vision weights ``official_names.py`` maps here.
    """

    config_class = OpenVLAConfig
    base_model_prefix = "vla"
    main_input_name = "pixel_values"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _no_split_modules = ["Dinov2WithRegistersLayer", "SiglipEncoderLayer", "LlamaDecoderLayer"]

    def __init__(self, config: OpenVLAConfig):
        super().__init__(config)
        self.check_config(config)
        self.vision_backbone = FusedVisionBackbone(config)
        self.projector = FusedProjector(self.vision_backbone.embed_dim, config.text_config.hidden_size)
        self.patch_positions = nn.Parameter(self.new_patch_code()) if config.patch_positions == "sincos" else None
        self.layout_token = self.new_layout_token() if config.layout_token == "linear" else None
        self.proprio_projector = self.new_proprio_projector() if config.proprio_dim else None
        self.language_model = LlamaForCausalLM(config.text_config)
        self.value_head = (
            ValueHead(config.text_config.hidden_size, config.value_hidden_sizes, config.num_value_outputs)
            if config.value_type is not None
            else None
        )
        self.post_init()
        self.vision_backbone.zero_cls_position()
        if self.layout_token is not None:
            self.layout_token = self.new_layout_token()  # post_init's generic init is too large for its input width

    @staticmethod
    def check_config(config: OpenVLAConfig) -> None:
        """Raises ConfigMismatchError (naming the field) if ``config`` does not fit this class."""
        check_autoregressive(config)

    def new_patch_code(self) -> torch.Tensor:
        """The place code a model with ``patch_positions="sincos"`` starts from: ``[P, D]``."""
        grid = self.config.image_size // self.config.vision_config.patch_size
        # amplitude near the projector's output scale, so neither drowns the other at the start
        return sincos_patch_code(grid, self.config.text_config.hidden_size, 0.25)

    def add_patch_positions(self) -> None:
        """Gives a model built without a place code (the official checkpoints have none) the code a
        new ``patch_positions="sincos"`` model starts from, to be learned in fine-tuning; every other
        weight is kept. Raises ConfigMismatchError if the model has a code already."""
        if self.patch_positions is not None:
            raise ConfigMismatchError(
                "patch_positions: the model has a place code already (sincos); nothing to add"
            )
        like = self.projector.fc3.weight
        self.patch_positions = nn.Parameter(self.new_patch_code().to(device=like.device, dtype=like.dtype))
        self.config.patch_positions = "sincos"

    def new_layout_token(self) -> nn.Linear:
        """The map a model with ``layout_token="linear"`` starts from: flattened patches ``[P * D]``
        -> one token ``[D]``, scaled so the token starts at the size of a projected patch."""
        num_patches, dim = self.vision_backbone.num_patches, self.config.text_config.hidden_size
        layer = nn.Linear(num_patches * dim, dim)
        nn.init.normal_(layer.weight, std=self.config.initializer_range / num_patches**0.5)
        nn.init.zeros_(layer.bias)
        return layer

    def add_layout_token(self) -> None:
        """Gives a model built without a layout token (the official checkpoints have none) the map a
        new ``layout_token="linear"`` model starts from, to be learned in fine-tuning; every other
        weight is kept. Raises ConfigMismatchError if the model has one already."""
        if self.layout_token is not None:
            raise ConfigMismatchError("layout_token: the model has a layout token already (linear); nothing to add")
        like = self.projector.fc3.weight
        self.layout_token = self.new_layout_token().to(device=like.device, dtype=like.dtype)
        self.config.layout_token = "linear"

    def new_proprio_projector(self) -> nn.Sequential:
        """The map of a z-scored robot state ``[S]`` to one token ``[D]`` (OpenVLA-OFT's proprio
        projector: linear, GELU, linear)."""
        dim = self.config.text_config.hidden_size
        return nn.Sequential(nn.Linear(self.config.proprio_dim, dim), nn.GELU(), nn.Linear(dim, dim))

    def add_proprio(self, stats: dict) -> None:
        """Gives a model built without a robot-state input the projector a new model with
        ``proprio_dim = len(stats["mean"])`` starts from, to be learned in fine-tuning; every other
        weight is kept. Raises ConfigMismatchError if the model reads a state already or the
        statistics are malformed (nothing is changed then)."""
        if self.proprio_projector is not None:
            raise ConfigMismatchError(f"proprio_dim: the model reads a robot state already "
                                      f"({self.config.proprio_dim} numbers); nothing to add")
        stats = {"mean": [float(v) for v in stats["mean"]], "std": [float(v) for v in stats["std"]]}
        previous = (self.config.proprio_dim, self.config.proprio_stats)
        self.config.proprio_dim, self.config.proprio_stats = len(stats["mean"]), stats
        try:
            self.config.check()
        except ConfigMismatchError:
            self.config.proprio_dim, self.config.proprio_stats = previous
            raise
        like = self.projector.fc3.weight
        self.proprio_projector = self.new_proprio_projector().to(device=like.device, dtype=like.dtype)

    def proprio_token(self, proprio: torch.Tensor | None, n: int) -> torch.Tensor | None:
        """The robot state as one token ``[N, 1, D]`` (None for a model without a state input).

        Shapes: proprio float ``[N, S]`` with ``S = config.proprio_dim``."""
        if self.proprio_projector is None:
            return None
        expected = (n, self.config.proprio_dim)
        if proprio is None or tuple(proprio.shape) != expected:
            got = None if proprio is None else tuple(proprio.shape)
            raise InvalidInputError(f"this model reads the robot state: proprio must be {list(expected)}, got {got}")
        stats = self.config.proprio_stats
        like = self.projector.fc3.weight
        mean = torch.tensor(stats["mean"], device=like.device, dtype=torch.float32)
        std = torch.tensor(stats["std"], device=like.device, dtype=torch.float32)
        z = (proprio.to(device=like.device, dtype=torch.float32) - mean) / std
        return self.proprio_projector(z.to(like.dtype)).unsqueeze(1)

    # --- Hugging Face plumbing ------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.language_model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.language_model.get_output_embeddings()

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.language_model.set_output_embeddings(value)

    # --- building blocks ------------------------------------------------------------------
    @property
    def action_tokenizer(self) -> ActionTokenizer:
        return ActionTokenizer(self.config.tokenizer_vocab_size, self.config.n_action_bins)

    @property
    def tokens_per_step(self) -> int:
        """``C * A``: action tokens produced per policy call."""
        return self.config.chunk_size * self.config.action_dim

    def embed_prefix(
        self,
        pixel_values: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        proprio: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[BOS, patches, prompt]`` embeddings and their validity.

        Shapes:
            pixel_values: ``[N, 6, H, W]``; input_ids: int64 ``[N, T]`` (no BOS, left-padded);
            attention_mask: ``[N, T]`` (1 = token, 0 = padding); proprio: ``[N, S]``, read only
            by a model with ``proprio_dim = S``.
            returns: embeddings ``[N, L, D]`` with ``L = 1 + P + T``, plus one for a layout token
            and one for the state token after the patches; valid bool ``[N, L]``.
        """
        n = input_ids.shape[0]
        if pixel_values.shape[0] != n or attention_mask.shape != input_ids.shape:
            raise InvalidInputError(
                f"batch mismatch: pixel_values {tuple(pixel_values.shape)}, "
                f"input_ids {tuple(input_ids.shape)}, "
                f"attention_mask {tuple(attention_mask.shape)}"
            )
        embed = self.get_input_embeddings()
        patches = self.projector(self.vision_backbone(pixel_values))  # [N, P, D]
        layout = None if self.layout_token is None else self.layout_token(patches.flatten(1)).unsqueeze(1)
        if self.patch_positions is not None:
            patches = patches + self.patch_positions
        if layout is not None:
            patches = torch.cat([patches, layout], dim=1)  # [N, P + 1, D]
        state = self.proprio_token(proprio, n)
        if state is not None:
            patches = torch.cat([patches, state.to(patches.dtype)], dim=1)
        bos = embed(torch.full((n, 1), self.config.bos_token_id, dtype=torch.long, device=input_ids.device))
        embeds = torch.cat([bos, patches.to(bos.dtype), embed(input_ids)], dim=1)
        valid = torch.cat(
            [
                torch.ones(n, 1 + patches.shape[1], dtype=torch.bool, device=input_ids.device),
                attention_mask.bool(),
            ],
            dim=1,
        )
        return embeds, valid

    def run_language_model(
        self, embeds: torch.Tensor, valid: torch.Tensor, num_bidirectional: int = 0
    ) -> torch.Tensor:
        """Last-layer hidden states of one full pass (no cache).

        Shapes:
            embeds: ``[N, K, D]``; valid: bool ``[N, K]``; returns ``[N, K, D]``.
        """
        out = self.language_model.model(
            inputs_embeds=embeds,
            attention_mask=attention_bias(valid, num_bidirectional, embeds.dtype),
            position_ids=position_ids_from_mask(valid),
            use_cache=False,
        )
        return out.last_hidden_state

    def action_logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits restricted to the action ids. Shapes: ``[..., D]`` -> float32 ``[..., n_bins]``."""
        rows = slice(self.action_tokenizer.first_action_id,
                     self.action_tokenizer.first_action_id + self.config.n_action_bins)
        head = self.get_output_embeddings()
        if hidden.dtype != torch.float32 and type(head) is torch.nn.Linear:
            # the action rows in float32: bfloat16 logits tie, and ties at the k-th value keep more than k
            # tokens, and break another way in a differently shaped batch (a sampled token then reads -inf)
            bias = None if head.bias is None else head.bias[rows].float()
            return torch.nn.functional.linear(hidden.float(), head.weight[rows].float(), bias)
        return head(hidden)[..., rows].float()

    def values_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Shapes: ``[N, D]`` -> ``[N, V]``, or None without a value head."""
        return None if self.value_head is None else self.value_head(hidden)

    def action_token_indices(self, action_token_ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids ``[N, C, A]`` -> indices into the action logits, validated."""
        expected = (self.config.chunk_size, self.config.action_dim)
        if action_token_ids.dim() != 3 or tuple(action_token_ids.shape[1:]) != expected:
            raise InvalidInputError(
                f"action_token_ids must be [N, {expected[0]}, {expected[1]}], "
                f"got {tuple(action_token_ids.shape)}"
            )
        bins = self.action_tokenizer.token_ids_to_bins(action_token_ids)  # validates the range
        return self.config.n_action_bins - 1 - bins

    # --- the three entry points -------------------------------------------------------------
    def forward(
        self,
        pixel_values: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        action_token_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        proprio: torch.Tensor | None = None,
        **kwargs,
    ) -> VLAOutput:
        """Teacher-forced pass: logits of every action token given the ones before it.

        The value is read from the hidden state that predicts the first action token (the last
        prompt position), so it depends on the observation only, never on the sampled action.

        Shapes:
            action_token_ids: int64 ``[N, 1, A]`` (required here).
        """
        if action_token_ids is None:
            raise InvalidInputError("OpenVLA's forward needs action_token_ids [N, 1, A] (teacher forcing)")
        self.action_token_indices(action_token_ids)
        embeds, valid = self.embed_prefix(pixel_values, input_ids, attention_mask, proprio)
        n, length = valid.shape
        tokens = action_token_ids.reshape(n, -1)[:, :-1]  # the last token is predicted, never fed
        seq = torch.cat([embeds, self.get_input_embeddings()(tokens)], dim=1)
        seq_valid = torch.cat([valid, torch.ones_like(tokens, dtype=torch.bool)], dim=1)
        hidden = self.run_language_model(seq, seq_valid)
        action_hidden = hidden[:, length - 1 : length - 1 + self.tokens_per_step]
        logits = self.action_logits_from_hidden(action_hidden)
        return VLAOutput(
            action_logits=logits.view(n, self.config.chunk_size, self.config.action_dim, -1),
            values=self.values_from_hidden(hidden[:, length - 1]),
            hidden_states=hidden if output_hidden_states else None,
            prefix_length=length,
        )

    @torch.no_grad()
    def sample_actions(
        self,
        pixel_values: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        proprio: torch.Tensor | None = None,
    ) -> SampledActionTokens:
        """Decodes ``A`` action tokens one at a time with a KV cache.

        Args:
            temperature, top_k: the sampling distribution; log-probs are taken under it.
            greedy: take the most likely token (log-probs still under the distribution above).
            generator: random source for reproducible sampling.

        Shapes:
            returns token_ids, log_probs ``[N, 1, A]``, values ``[N, V]``.
        """
        check_sampling_args(temperature, top_k, self.config.n_action_bins)
        embeds, valid = self.embed_prefix(pixel_values, input_ids, attention_mask, proprio)
        n = embeds.shape[0]
        cache = DynamicCache(config=self.config.text_config)
        positions = position_ids_from_mask(valid)
        out = self.language_model.model(
            inputs_embeds=embeds,
            attention_mask=attention_bias(valid, 0, embeds.dtype),
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
        last = out.last_hidden_state[:, -1]
        values = self.values_from_hidden(last)
        next_position = positions[:, -1:] + 1
        first = self.action_tokenizer.first_action_id
        tokens, log_probs = [], []
        for step in range(self.config.action_dim):
            logits = processed_logits(self.action_logits_from_hidden(last), temperature, top_k)
            index = logits.argmax(-1) if greedy else sample_indices(logits, generator)
            log_prob, _ = log_prob_and_entropy(logits, index)
            tokens.append(first + index)
            log_probs.append(log_prob)
            if step == self.config.action_dim - 1:
                break
            valid = torch.cat([valid, torch.ones(n, 1, dtype=torch.bool, device=valid.device)], dim=1)
            token_embeds = self.get_input_embeddings()(tokens[-1].unsqueeze(1))
            out = self.language_model.model(
                inputs_embeds=token_embeds,
                attention_mask=decode_step_bias(valid, token_embeds.dtype),
                position_ids=next_position,
                cache=cache,
                use_cache=True,
            )
            last = out.last_hidden_state[:, -1]
            next_position = next_position + 1
        return SampledActionTokens(
            token_ids=torch.stack(tokens, dim=1).view(n, 1, -1),
            log_probs=torch.stack(log_probs, dim=1).view(n, 1, -1),
            values=values,
        )

    def evaluate_actions(
        self,
        pixel_values: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        action_token_ids: torch.Tensor,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        proprio: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Log-probs, entropy and values of given action tokens (differentiable).

        Shapes:
            action_token_ids: int64 ``[N, C, A]``.
            returns: ``(log_probs [N, C, A], entropy [N, C, A], values [N, V] or None)``.
        """
        check_sampling_args(temperature, top_k, self.config.n_action_bins)
        indices = self.action_token_indices(action_token_ids)
        out = self(pixel_values, input_ids, attention_mask, action_token_ids=action_token_ids, proprio=proprio)
        log_probs, entropy = log_prob_and_entropy(
            processed_logits(out.action_logits, temperature, top_k), indices
        )
        return log_probs, entropy, out.values


OpenVLAForActionPrediction.register_for_auto_class("AutoModelForImageTextToText")
