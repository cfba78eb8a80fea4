"""Fuzzing the recipe overrides users type (``vla-train --config R key=value ...``): whatever the
key path, nesting or value, loading either succeeds or raises ``ConfigError`` naming the key it
refuses; never another exception, never a silently dropped key."""

from __future__ import annotations

from dataclasses import fields, is_dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vla_trainer.config import ConfigError, load_config
from vla_trainer.config.schema import TrainConfig


def _leaf_keys(cls, prefix="") -> list[str]:
    keys = []
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            keys += _leaf_keys(type(default), f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


KEYS = _leaf_keys(TrainConfig)
SECTIONS = sorted({k.rsplit(".", i)[0] for k in KEYS for i in range(1, k.count(".") + 1)})
segment = st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
key = st.one_of(
    st.sampled_from(KEYS),                                                      # a real key
    st.sampled_from(KEYS).flatmap(lambda k: segment.map(lambda s: f"{k}.{s}")),  # nested below a leaf
    st.sampled_from(KEYS).map(lambda k: k.rsplit(".", 1)[0] if "." in k else k), # a section, not a leaf
    st.lists(segment, min_size=1, max_size=4).map(".".join),                    # made up
)
value = st.one_of(
    st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["true", "false", "null", "", "[]", "{}", "[1, 2]", "{a: 1}", "grpo", "gae", "cpu",
                     "nan", "-inf", "1e400", "'quoted'", "${oc.env:HOME}", "???", "=="]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
)


@pytest.mark.reliability(fault="recipe overrides: random key paths, nesting and values (`key=value`)",
                         cases=400, outcome="refused with an error naming the key, or applied")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.tuples(key, value), min_size=1, max_size=3),
       recipe=st.sampled_from([None, "cpu_ppo_tiny_put_on_plate", "cpu_grpo_tiny_put_on_plate"]))
def test_any_override_loads_or_is_refused_naming_its_key(items, recipe):
    overrides = [f"{k}={v}" for k, v in items]
    try:
        load_config(recipe, overrides)
    except ConfigError as e:
        message = str(e)
        # the refusal names the override, or the key or section a rule checks (validate names its own)
        assert "override" in message or any(k in message for k in KEYS + SECTIONS), message
    # any other exception type fails the test
