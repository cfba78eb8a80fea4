"""Training recipes: a typed schema with the reference's key names, YAML loading, overrides."""

from .loading import (
    ConfigError,
    ConfigWarning,
    check_batch_sizes,
    load_config,
    parse_devices,
    placement_mode,
    recipe_names,
    recipe_path,
    to_dict,
    to_yaml,
    validate,
)
from .schema import TrainConfig

__all__ = [
    "ConfigError",
    "ConfigWarning",
    "TrainConfig",
    "check_batch_sizes",
    "load_config",
    "parse_devices",
    "placement_mode",
    "recipe_names",
    "recipe_path",
    "to_dict",
    "to_yaml",
    "validate",
]
