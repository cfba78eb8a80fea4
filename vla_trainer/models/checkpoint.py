"""Loading our own saved checkpoints (base or merged) with our classes, and their tokenizer.

``save_pretrained`` directories also load through ``AutoModelForImageTextToText`` with
``trust_remote_code=True`` (the code is saved beside the weights); these functions load them
with the installed package instead, and never prompt about remote code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .config import OpenVLAConfig, OpenVLAOFTConfig
from .errors import ConfigMismatchError
from .oft import OpenVLAOFTForActionPrediction
from .openvla import OpenVLAForActionPrediction

MODEL_CLASSES = {
    OpenVLAConfig.model_type: OpenVLAForActionPrediction,
    OpenVLAOFTConfig.model_type: OpenVLAOFTForActionPrediction,
}


def load_tokenizer(directory: str | os.PathLike):
    """The tokenizer saved in a checkpoint directory (ours or an official OpenVLA one)."""
    from transformers import AutoTokenizer, PreTrainedConfig

    # A blank config: the tokenizer class comes from tokenizer_config.json, and AutoTokenizer
    # would otherwise load config.json, whose custom code makes it ask interactively.
    return AutoTokenizer.from_pretrained(str(directory), config=PreTrainedConfig(), trust_remote_code=False)


def load_pretrained(directory: str | os.PathLike, **kwargs):
    """``(model, tokenizer)`` of a directory written by ``save_pretrained`` / ``export_merged``.

    Raises:
        ConfigMismatchError: the directory's config.json is not one of our model types.
    """
    directory = Path(directory)
    model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    if model_type not in MODEL_CLASSES:
        raise ConfigMismatchError(
            f"{directory}/config.json field 'model_type' is {model_type!r}; expected one of "
            f"{sorted(MODEL_CLASSES)} (official OpenVLA checkpoints load with load_official_openvla)"
        )
    model = MODEL_CLASSES[model_type].from_pretrained(str(directory), **kwargs).eval()
    return model, load_tokenizer(directory)
