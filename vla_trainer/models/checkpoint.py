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
from .errors import ConfigMismatchError, CorruptCheckpointError
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
    """``(model, tokenizer)`` of a directory written by ``save_pretrained`` / ``vla_trainer.checkpoint.export_merged``.

    Raises:
        FileNotFoundError: ``directory`` is not a folder.
        ConfigMismatchError: the directory's config.json is not one of our model types.
        CorruptCheckpointError: config.json is not a JSON object, or the weights file is
            truncated or damaged.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is {'a file' if directory.exists() else 'missing'}: a model is a "
                                "folder holding config.json, model.safetensors and the tokenizer")
    config = read_json_object(directory / "config.json")
    model_type = config.get("model_type")
    if model_type not in MODEL_CLASSES:
        raise ConfigMismatchError(
            f"{directory}/config.json field 'model_type' is {model_type!r}; expected one of "
            f"{sorted(MODEL_CLASSES)} (official OpenVLA checkpoints load with load_official_openvla)"
        )
    check_safetensors(directory)
    model = MODEL_CLASSES[model_type].from_pretrained(str(directory), **kwargs).eval()
    return model, load_tokenizer(directory)


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``, or CorruptCheckpointError naming the file and the fault."""
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"{path} is not valid JSON ({e}); the file is damaged or was cut short, "
                                     "use another checkpoint or save this one again") from None
    if not isinstance(data, dict):
        raise CorruptCheckpointError(f"{path} holds a JSON {type(data).__name__}, not the object of fields a "
                                     "checkpoint's config is")
    return data


def check_safetensors(directory: Path) -> None:
    """Opens every ``*.safetensors`` of ``directory`` and reads each tensor's header and extent: a
    truncated or overwritten file raises CorruptCheckpointError naming it (transformers would
    report it as a generic load failure, or not at all for a zero-filled tail)."""
    from safetensors import safe_open

    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key)
        except Exception as e:  # noqa: BLE001  (safetensors raises its own SafetensorError or OSError)
            raise CorruptCheckpointError(f"{path} cannot be read ({type(e).__name__}: {e}); the file is damaged or "
                                         "was cut short, use another checkpoint or save this one again") from None
