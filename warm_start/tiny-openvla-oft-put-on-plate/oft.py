"""OpenVLA-OFT for RL: a whole chunk of discrete action tokens decoded in ONE forward pass.

The sequence is ``[BOS, patches, prompt, S empty slots]`` with ``S = chunk_size x action_dim``.
Slots carry zero embeddings (they are placeholders, not previous actions; the tiny presets,
trained from scratch, learn one vector per slot instead) and see the prompt
and each other (bidirectional block), while the prompt stays causal, so the prompt's hidden
states equal those of a plain causal run. Slot ``j``'s own output is the logit vector of
action token ``j``; the value is read at the first slot. This keeps OpenVLA's token
probabilities (needed for PPO/GRPO) where the official OFT regresses continuous actions.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import OpenVLAOFTConfig
from .errors import InvalidInputError
from .openvla import OpenVLAForActionPrediction, SampledActionTokens, VLAOutput
from .sampling import check_sampling_args, log_prob_and_entropy, processed_logits, sample_indices


class OpenVLAOFTForActionPrediction(OpenVLAForActionPrediction):
    """The OpenVLA backbone with parallel decoding of ``chunk_size`` actions (default 8)."""

    config_class = OpenVLAOFTConfig

    def __init__(self, config: OpenVLAOFTConfig):
        super().__init__(config)
        self.action_slots = None
        if config.slot_embeddings == "learned":
            weight = torch.randn(self.tokens_per_step, config.text_config.hidden_size) * config.initializer_range
            self.action_slots = nn.Parameter(weight)

    @staticmethod
    def check_config(config: OpenVLAOFTConfig) -> None:
        """Any chunk size works here; the config validated the rest."""

    def forward(
        self,
        pixel_values: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        action_token_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        slot_embeds: torch.Tensor | None = None,
        proprio: torch.Tensor | None = None,
        **kwargs,
    ) -> VLAOutput:
        """One pass over prompt + slots. ``action_token_ids`` are not needed (only validated).

        Args:
            slot_embeds: inputs of the action slots ``[N, S, D]``; if None, the model's own
                (``config.slot_embeddings``: zeros, empty slots, or learned vectors).

        Shapes:
            returns action_logits ``[N, C, A, n_bins]``, values ``[N, V]``.
        """
        if action_token_ids is not None:
            self.action_token_indices(action_token_ids)
        embeds, valid = self.embed_prefix(pixel_values, input_ids, attention_mask, proprio)
        n, length = valid.shape
        num_slots = self.tokens_per_step
        if slot_embeds is None and self.action_slots is not None:
            slot_embeds = self.action_slots.unsqueeze(0).expand(n, -1, -1)
        elif slot_embeds is None:
            slot_embeds = embeds.new_zeros(n, num_slots, embeds.shape[-1])
        elif tuple(slot_embeds.shape) != (n, num_slots, embeds.shape[-1]):
            raise InvalidInputError(
                f"slot_embeds must be [{n}, {num_slots}, {embeds.shape[-1]}], got {tuple(slot_embeds.shape)}"
            )
        seq = torch.cat([embeds, slot_embeds.to(embeds.dtype)], dim=1)
        seq_valid = torch.cat([valid, torch.ones(n, num_slots, dtype=torch.bool, device=valid.device)], dim=1)
        hidden = self.run_language_model(seq, seq_valid, num_bidirectional=num_slots)
        logits = self.action_logits_from_hidden(hidden[:, length:])
        return VLAOutput(
            action_logits=logits.view(n, self.config.chunk_size, self.config.action_dim, -1),
            values=self.values_from_hidden(hidden[:, length]),
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
        """All ``C x A`` tokens from one forward; each slot sampled independently.

        Shapes:
            returns token_ids, log_probs ``[N, C, A]``, values ``[N, V]``.
        """
        check_sampling_args(temperature, top_k, self.config.n_action_bins)
        out = self(pixel_values, input_ids, attention_mask, proprio=proprio)
        logits = processed_logits(out.action_logits, temperature, top_k)
        index = logits.argmax(-1) if greedy else sample_indices(logits, generator)
        log_probs, _ = log_prob_and_entropy(logits, index)
        return SampledActionTokens(
            token_ids=self.action_tokenizer.first_action_id + index, log_probs=log_probs, values=out.values
        )


OpenVLAOFTForActionPrediction.register_for_auto_class("AutoModelForImageTextToText")
