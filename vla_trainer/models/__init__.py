"""VLA policies for RL fine-tuning: OpenVLA and OpenVLA-OFT on current transformers.

Entry points:
    build_model(preset)            tiny CPU presets and the 7B architecture (presets.py)
    load_official_openvla(source)  official openvla/openvla-7b weights into our classes
    load_pretrained(directory)     our saved / exported checkpoints (models/checkpoint.py)
    VLAPolicy(model, tokenizer)    env observations -> action chunks, log-probs, values
    apply_lora / save_lora / load_lora / merge_lora   (lora.py)
"""

from .action_tokenizer import ActionTokenizer, identity_norm_stats, unnormalize_actions
from .checkpoint import load_pretrained, load_tokenizer
from .config import OpenVLAConfig, OpenVLAOFTConfig
from .errors import (
    AdapterMismatchError,
    ConfigMismatchError,
    CorruptCheckpointError,
    InvalidInputError,
    UnknownUnnormKeyError,
    VLAModelError,
)
from .lora import apply_lora, load_lora, lora_target_modules, merge_lora, save_lora
from .official_names import config_from_official, load_official_openvla, official_state_dict
from .oft import OpenVLAOFTForActionPrediction
from .openvla import OpenVLAForActionPrediction
from .policy import ActionEvaluation, ActionSample, Policy, PolicyInputs, VLAPolicy, param_groups
from .presets import PRESETS, build_config, build_model, build_tokenizer
from .sampling import EnvGenerators
from .tokenizer import build_byte_tokenizer, tokenize_prompts

__all__ = [
    "EnvGenerators",
    "ActionEvaluation",
    "ActionSample",
    "ActionTokenizer",
    "AdapterMismatchError",
    "ConfigMismatchError",
    "CorruptCheckpointError",
    "InvalidInputError",
    "OpenVLAConfig",
    "OpenVLAForActionPrediction",
    "OpenVLAOFTConfig",
    "OpenVLAOFTForActionPrediction",
    "PRESETS",
    "Policy",
    "PolicyInputs",
    "UnknownUnnormKeyError",
    "VLAModelError",
    "VLAPolicy",
    "apply_lora",
    "build_byte_tokenizer",
    "build_config",
    "build_model",
    "build_tokenizer",
    "config_from_official",
    "identity_norm_stats",
    "load_lora",
    "load_official_openvla",
    "load_pretrained",
    "load_tokenizer",
    "lora_target_modules",
    "merge_lora",
    "official_state_dict",
    "param_groups",
    "save_lora",
    "tokenize_prompts",
    "unnormalize_actions",
]
