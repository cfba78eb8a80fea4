"""Prompts -> ``input_ids``, and the small byte-level tokenizer of the tiny presets.

Full-size models use the Llama-2 tokenizer saved with the checkpoint. The tiny presets use a
tokenizer built here, deterministically and offline: ``<unk> <s> </s>``, the 256 bytes (no
merges, so any text encodes), then ``n_action_bins`` reserved action tokens that text never
produces, as the LAST ids of the base vocabulary (the layout OpenVLA relies on), then
``<pad>``. It saves and loads like any Hugging Face tokenizer. With ``vocab_size`` it stands in
for a larger vocabulary (unused filler tokens before the action tokens), so a full-size model can
be run without its tokenizer's download where the prompt's text does not matter (benchmarks).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from .config import OpenVLAConfig
from .errors import ConfigMismatchError, InvalidInputError

SPECIALS = ("<unk>", "<s>", "</s>")


def build_byte_tokenizer(n_action_bins: int = 256, vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """The tiny presets' tokenizer: base vocabulary ``3 + 256 + n_action_bins`` (or ``vocab_size``,
    padded with unused tokens before the action tokens), pad id right after it."""
    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    fillers = 0 if vocab_size is None else vocab_size - (len(SPECIALS) + len(byte_symbols) + n_action_bins)
    if fillers < 0:
        raise ValueError(f"vocab_size={vocab_size}: at least {len(SPECIALS) + len(byte_symbols) + n_action_bins} "
                         f"(specials, bytes and {n_action_bins} action tokens)")
    vocab_list = [*SPECIALS, *byte_symbols, *(f"<unused_{i}>" for i in range(fillers)),
                  *(f"<act_{i:03d}>" for i in range(n_action_bins))]
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    tok.add_special_tokens([*SPECIALS, "<pad>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def check_tokenizer(tokenizer, config: OpenVLAConfig) -> None:
    """Raises ConfigMismatchError if the tokenizer's ids disagree with the model config."""
    if len(tokenizer) < config.tokenizer_vocab_size:
        raise ConfigMismatchError(
            f"tokenizer has {len(tokenizer)} ids but config.tokenizer_vocab_size is "
            f"{config.tokenizer_vocab_size}; this tokenizer belongs to another model"
        )
    for field in ("bos_token_id", "pad_token_id"):
        if getattr(tokenizer, field) is not None and getattr(tokenizer, field) != getattr(config, field):
            raise ConfigMismatchError(
                f"tokenizer.{field} is {getattr(tokenizer, field)} "
                f"but config.{field} is {getattr(config, field)}"
            )


def format_prompt(instruction: str, config: OpenVLAConfig) -> str:
    """OpenVLA's prompt for one instruction (lower-cased as OpenVLA does).

    Raises:
        InvalidInputError: the instruction is not a string or is empty.
    """
    if not isinstance(instruction, str):
        raise InvalidInputError(f"an instruction must be a str, got {type(instruction).__name__}")
    text = instruction.strip()
    if not text:
        raise InvalidInputError("an instruction is empty; every env must give a non-empty instruction")
    if config.lowercase_instruction:
        text = text.lower()
    return config.prompt_template.format(instruction=text)


def tokenize_prompts(
    tokenizer, instructions: Sequence[str], config: OpenVLAConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenized prompts without BOS, left-padded so that every prompt ends at the last column.

    Shapes:
        instructions: ``N`` strings.
        returns: ``input_ids`` int64 ``[N, T]``, ``attention_mask`` bool ``[N, T]``.
    """
    if isinstance(instructions, str) or len(instructions) == 0:
        raise InvalidInputError("instructions must be a non-empty sequence of strings (one per env)")
    rows = []
    end_id = config.prompt_end_token_id
    for instruction in instructions:
        prompt = format_prompt(instruction, config)
        if end_id is not None:
            # OpenVLA tokenizes the prompt up to "Out:" and appends Llama's empty token itself;
            # how a tokenizer splits a trailing space varies between versions.
            prompt = prompt.rstrip()
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        if ids and ids[0] == config.bos_token_id:
            ids = ids[1:]  # the model inserts BOS (then the image patches) itself
        if end_id is not None and (not ids or ids[-1] != end_id):
            ids = ids + [end_id]
        rows.append(ids)
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), config.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, ids in enumerate(rows):
        if ids:
            input_ids[i, length - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, length - len(ids) :] = True
    return input_ids, attention_mask
