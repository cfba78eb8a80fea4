"""Configs of the OpenVLA and OpenVLA-OFT policies (Hugging Face ``PreTrainedConfig`` classes).

One config holds the whole policy: the two vision towers (DINOv2 with registers + SigLIP,
transformers' own configs), the Llama-2 language model, the action tokenizer settings, the
prompt, the un-normalisation statistics and the value head. The defaults are the official
``openvla/openvla-7b`` architecture; ``presets.py`` builds the tiny CPU variants from the same
class. A saved checkpoint therefore carries everything needed to turn tokens into robot actions.
"""

from __future__ import annotations

from transformers import Dinov2WithRegistersConfig, LlamaConfig, PreTrainedConfig, SiglipVisionConfig
from transformers.configuration_utils import SubConfigSpec

from .errors import ConfigMismatchError

OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut: "
VALUE_TYPES = ("chunk_level", "action_level")
PATCH_POSITIONS = ("none", "sincos")
LAYOUT_TOKENS = ("none", "linear")

# The official OpenVLA-7B architecture ("dinosiglip-vit-so-224px" + "llama2-7b-pure").
DINOV2_LARGE_REG4_224 = dict(
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    mlp_ratio=4,
    patch_size=14,
    image_size=224,
    num_register_tokens=4,
    layerscale_value=1e-5,
    hidden_act="gelu",
    layer_norm_eps=1e-6,
)
# timm's vit_so400m_patch14_siglip_224 as OpenVLA builds it: exact (erf) GELU (timm's default), unlike
# transformers' SigLIP default (tanh approximation).
SIGLIP_SO400M_224 = dict(
    hidden_size=1152,
    intermediate_size=4304,
    num_hidden_layers=27,
    num_attention_heads=16,
    patch_size=14,
    image_size=224,
    hidden_act="gelu",
    layer_norm_eps=1e-6,
    vision_use_head=True,
)
# Llama-2-7B with the table padded to 32064 rows. Norm epsilon and context length are what the
# official config.json resolves to (transformers 4.40's LlamaConfig defaults fill the fields it
# omits); load_official_openvla reads them from the checkpoint itself.
LLAMA2_7B_OPENVLA = dict(
    vocab_size=32064,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    pad_token_id=32000,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


ACTION_GRIPPER_CONVENTIONS = ("contract", "openvla", "panda")
"""``OpenVLAConfig.action_gripper``'s values."""


class OpenVLAConfig(PreTrainedConfig):
    """OpenVLA: fused DINOv2 + SigLIP vision, fused MLP projector, Llama-2, one action per step.

    Fields beyond the three sub-configs (``vision_config`` DINOv2-with-registers,
    ``fused_vision_config`` SigLIP, ``text_config`` Llama):

    * ``image_size``: square input size both towers see (224 for OpenVLA-7B).
    * ``vision_feature_layer``: which block's output the towers hand on; ``-2`` = the
      second-to-last block (OpenVLA's choice), so the last block is never run.
    * ``image_mean`` / ``image_std``: per tower ``[[3], [3]]`` normalisation of ``[0, 1]`` RGB.
    * ``tokenizer_vocab_size``, ``n_action_bins``: action ids are the last ``n_action_bins``
      ids below ``tokenizer_vocab_size`` (see action_tokenizer.py).
    * ``action_dim``, ``chunk_size``: each forward predicts ``chunk_size x action_dim`` tokens.
    * ``prompt_template``, ``lowercase_instruction``, ``bos_token_id``, ``pad_token_id``,
      ``prompt_end_token_id``: how an instruction becomes ``input_ids``. With an end token
      set, the prompt is tokenized without its trailing space and the end token appended
      (Llama's empty ``"▁"`` token 29871, which OpenVLA was trained with after ``"Out:"``).
    * ``norm_stats``: ``{unnorm_key: {"action": {"q01", "q99", "mask"}}}``.
    * ``value_type``: None (no value head), ``"chunk_level"`` (one value) or
      ``"action_level"`` (``chunk_size`` values); ``value_hidden_sizes``: its MLP widths.
    * ``patch_positions``: ``"none"`` (the official model) or ``"sincos"``: a trained code per
      patch, started as 2-D sine-cosine of its grid place, added to the projected patches. The
      language model's rotary positions shape only which tokens attend to which; what a slot
      reads from a patch is its features, and a small vision tower trained from scratch keeps
      little of where its patch sits. With the code, attending to the object's patch also reads
      where it is.
    * ``layout_token``: ``"none"`` (the official model) or ``"linear"``: one more token after the
      patches, a trained linear map of all projected patches flattened. A slot reads where the
      object is from this one token instead of having to find the object's patch; a linear
      read-out of the flattened patches predicts the first reach twice as well as the mean,
      where attention over the patches learned little of it (``docs/results.md``).
    * ``action_gripper``: what the model's last action dimension means, turned into the envs'
      gripper command (-1 open, +1 close) when actions are decoded and back for training targets:
      ``"contract"`` (that command itself: every model our SFT trains), ``"openvla"`` (``[0, 1]``,
      1 open: OpenVLA's datasets, its LIBERO fine-tunes included; ``-sign(2a - 1)``, as the
      reference converts them for LIBERO), ``"panda"`` (ManiSkill's raw Panda command, +1 open:
      the reference's ManiSkill fine-tunes; ``-a``).
    * ``proprio_dim``: 0 (the official OpenVLA) or the width of the robot state the policy also
      reads (``obs["state"]``), as OpenVLA-OFT's proprio input: z-scored with ``proprio_stats``
      (``{"mean": [...], "std": [...]}``, from the demos it was trained on) and projected by a
      two-layer MLP to one token after the patches. An image alone does not say whether the
      fingers hold the object (a gripper descending open and one lifting closed look alike at
      64 px); the finger joints do.
    """

    model_type = "vla_openvla"
    sub_configs_defaults = {
        "vision_config": SubConfigSpec(
            config_class=Dinov2WithRegistersConfig, init_kwargs=DINOV2_LARGE_REG4_224
        ),
        "fused_vision_config": SubConfigSpec(config_class=SiglipVisionConfig, init_kwargs=SIGLIP_SO400M_224),
        "text_config": SubConfigSpec(config_class=LlamaConfig, init_kwargs=LLAMA2_7B_OPENVLA),
    }

    vision_config: dict | PreTrainedConfig | None = None
    fused_vision_config: dict | PreTrainedConfig | None = None
    text_config: dict | PreTrainedConfig | None = None
    image_size: int = 224
    vision_feature_layer: int = -2
    image_mean: list | None = None
    image_std: list | None = None
    tokenizer_vocab_size: int = 32000
    n_action_bins: int = 256
    action_dim: int = 7
    chunk_size: int = 1
    prompt_template: str = OPENVLA_PROMPT
    lowercase_instruction: bool = True
    bos_token_id: int = 1
    pad_token_id: int = 32000
    prompt_end_token_id: int | None = 29871
    norm_stats: dict | None = None
    value_type: str | None = None
    value_hidden_sizes: list | None = None
    patch_positions: str = "none"
    layout_token: str = "none"
    proprio_dim: int = 0
    proprio_stats: dict | None = None
    action_gripper: str = "contract"
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        saved_type = kwargs.pop("model_type", None)
        if saved_type is not None and saved_type != type(self).model_type:
            raise ConfigMismatchError(
                f"config field 'model_type' is {saved_type!r} but {type(self).__name__} expects "
                f"{type(self).model_type!r}; load this checkpoint with the class made for {saved_type!r}"
            )
        super().__post_init__(**kwargs)
        if self.image_mean is None:
            self.image_mean = [[0.485, 0.456, 0.406], [0.5, 0.5, 0.5]]  # DINOv2: ImageNet; SigLIP: 0.5
        if self.image_std is None:
            self.image_std = [[0.229, 0.224, 0.225], [0.5, 0.5, 0.5]]
        if self.value_hidden_sizes is None:
            self.value_hidden_sizes = [512, 128]
        if self.norm_stats is None:
            self.norm_stats = {}
        self.check()

    @property
    def num_value_outputs(self) -> int:
        """1 for chunk-level values, ``chunk_size`` for action-level, 0 without a value head."""
        return {None: 0, "chunk_level": 1, "action_level": self.chunk_size}[self.value_type]

    def check(self) -> None:
        """Validates the fields against each other.

        Raises:
            ConfigMismatchError: naming the first field that is wrong and what is allowed.
        """

        def fail(field: str, message: str):
            raise ConfigMismatchError(f"{type(self).__name__}.{field}: {message}")

        expected_types = {
            "vision_config": "dinov2_with_registers",
            "fused_vision_config": "siglip_vision_model",
            "text_config": "llama",
        }
        for field, model_type in expected_types.items():
            if getattr(self, field).model_type != model_type:
                fail(
                    f"{field}.model_type", f"must be {model_type!r}, got {getattr(self, field).model_type!r}"
                )
        for field in ("vision_config", "fused_vision_config"):
            sub = getattr(self, field)
            if sub.image_size != self.image_size:
                fail(f"{field}.image_size", f"must equal image_size={self.image_size}, got {sub.image_size}")
            if self.image_size % sub.patch_size:
                fail(f"{field}.patch_size", f"{sub.patch_size} does not divide image_size={self.image_size}")
            n_layers = sub.num_hidden_layers
            if not -n_layers <= self.vision_feature_layer < n_layers:
                fail("vision_feature_layer", f"must index one of the {n_layers} blocks of {field}")
        if self.vision_config.patch_size != self.fused_vision_config.patch_size:
            fail("fused_vision_config.patch_size", "both towers must yield the same patch grid")
        if not self.fused_vision_config.vision_use_head:
            fail(
                "fused_vision_config.vision_use_head",
                "must be True (the official checkpoint has the pooling head)",
            )
        for field in ("image_mean", "image_std"):
            value = getattr(self, field)
            if len(value) != 2 or any(len(v) != 3 for v in value):
                fail(field, f"must be two RGB triples (DINOv2, SigLIP), got {value}")
        if not 2 <= self.n_action_bins <= self.tokenizer_vocab_size:
            fail("n_action_bins", f"must be in [2, tokenizer_vocab_size={self.tokenizer_vocab_size}]")
        if self.text_config.vocab_size <= self.tokenizer_vocab_size:
            fail(
                "text_config.vocab_size",
                f"{self.text_config.vocab_size} must exceed tokenizer_vocab_size={self.tokenizer_vocab_size} "
                "(the pad token sits after the base vocabulary)",
            )
        if not 0 <= self.pad_token_id < self.text_config.vocab_size:
            fail("pad_token_id", f"{self.pad_token_id} is outside the embedding table")
        if self.action_dim < 1:
            fail("action_dim", f"must be >= 1, got {self.action_dim}")
        if self.action_gripper not in ACTION_GRIPPER_CONVENTIONS:
            fail("action_gripper", f"{self.action_gripper!r} is not one of {', '.join(ACTION_GRIPPER_CONVENTIONS)}")
        if self.chunk_size < 1:
            fail("chunk_size", f"must be >= 1, got {self.chunk_size}")
        if self.value_type not in (None, *VALUE_TYPES):
            fail("value_type", f"must be None or one of {VALUE_TYPES}, got {self.value_type!r}")
        if self.patch_positions not in PATCH_POSITIONS:
            fail("patch_positions", f"must be one of {PATCH_POSITIONS}, got {self.patch_positions!r}")
        if self.layout_token not in LAYOUT_TOKENS:
            fail("layout_token", f"must be one of {LAYOUT_TOKENS}, got {self.layout_token!r}")
        if self.proprio_dim < 0:
            fail("proprio_dim", f"must be 0 (no robot state) or the state's width, got {self.proprio_dim}")
        if self.proprio_dim:
            stats = self.proprio_stats or {}
            for key in ("mean", "std"):
                if len(stats.get(key) or ()) != self.proprio_dim:
                    fail(f"proprio_stats.{key}", f"must hold proprio_dim={self.proprio_dim} numbers, "
                                                 f"got {stats.get(key)!r}")
            if min(stats["std"]) <= 0:
                fail("proprio_stats.std", f"must be > 0 everywhere, got {stats['std']}")
        if "{instruction}" not in self.prompt_template:
            fail("prompt_template", "must contain '{instruction}'")


class OpenVLAOFTConfig(OpenVLAConfig):
    """OpenVLA-OFT for RL: the OpenVLA backbone decoding ``chunk_size x action_dim`` discrete
    action tokens in parallel (one forward pass); ``chunk_size`` defaults to 8."""

    model_type = "vla_openvla_oft"
    chunk_size: int = 8
    # inputs of the action slots: "zeros" as in the official OFT (its pretrained Llama tells the
    # slots apart by position), or "learned", one trained vector per slot, for models trained
    # from scratch, whose slots otherwise start identical (RMSNorm of zero is zero)
    slot_embeddings: str = "zeros"

    def check(self) -> None:
        super().check()
        if self.slot_embeddings not in SLOT_EMBEDDINGS:
            raise ConfigMismatchError(f"{type(self).__name__}.slot_embeddings: must be one of {SLOT_EMBEDDINGS}, "
                                      f"got {self.slot_embeddings!r}")


SLOT_EMBEDDINGS = ("zeros", "learned")


def check_autoregressive(config: OpenVLAConfig) -> None:
    """OpenVLA decodes one action per forward; a chunk needs the OFT class."""
    if config.chunk_size != 1:
        raise ConfigMismatchError(
            f"{type(config).__name__}.chunk_size: OpenVLA (token-by-token) predicts one action per step, "
            f"so chunk_size must be 1, got {config.chunk_size}; use OpenVLAOFTForActionPrediction for chunks"
        )


OpenVLAConfig.register_for_auto_class()
OpenVLAOFTConfig.register_for_auto_class()
