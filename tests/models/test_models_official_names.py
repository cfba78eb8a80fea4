"""Our full-size models map exactly onto the official openvla/openvla-7b parameter table."""

from __future__ import annotations

import math

import pytest
import tiny_vla  # noqa: F401
import torch

from vla_trainer.models import build_config, official_state_dict
from vla_trainer.models.official_names import is_ours_only
from vla_trainer.models.official_table import load_table, openvla_7b_param_shapes
from vla_trainer.models.presets import model_class_for


def test_checked_in_table_is_what_the_generator_writes():
    table = load_table()
    assert table["parameters"] == openvla_7b_param_shapes()
    assert table["total_parameters"] == sum(math.prod(s) for s in table["parameters"].values())
    assert len(table["parameters"]) == 982
    assert 7.50e9 < table["total_parameters"] < 7.60e9  # "7.54B"


@pytest.mark.parametrize("preset", ["openvla-7b", "openvla-oft-7b"])
def test_full_size_model_on_meta_maps_onto_the_official_table(preset):
    config = build_config(preset, value_type="chunk_level")
    with torch.device("meta"):
        model = model_class_for(config)(config)
    official = official_state_dict(model)
    table = load_table()["parameters"]
    assert sorted(official) == sorted(table)  # every official name, nothing extra
    wrong = {n: (list(official[n].shape), table[n]) for n in table if list(official[n].shape) != table[n]}
    assert not wrong
    ours_only = sorted(n for n in model.state_dict() if is_ours_only(n))
    assert ours_only == [
        "value_head.fc1.bias",
        "value_head.fc1.weight",
        "value_head.fc2.bias",
        "value_head.fc2.weight",
        "value_head.fc3.bias",
        "value_head.fc3.weight",
        "vision_backbone.featurizer.embeddings.mask_token",
    ]
    assert model.value_head.fc1.weight.shape == (512, 4096) and model.value_head.fc3.weight.shape == (1, 128)
    n_ours = sum(p.numel() for n, p in model.named_parameters() if not is_ours_only(n))
    # ours holds one extra row: DINOv2's CLS position slot, which timm's model lacks (kept at zero)
    assert n_ours - load_table()["total_parameters"] == 1024
