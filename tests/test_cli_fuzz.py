"""Every command's arguments, fuzzed: a malformed value of any flag gets a non-zero exit and an
error line naming what was wrong, never a traceback, and nothing on disk changes.

Each case is one command line with one slot filled by hypothesis with a value that can never be
valid (a missing path, a count below 1, text where a number goes, JSON that is not an object),
so a command that accepted it would be a bug, and none of them starts real work."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shipped_paths import SHIPPED_WARM_START

SHIPPED = str(SHIPPED_WARM_START)

# what a shell can pass: any text but NUL (an argv string cannot hold it)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _positive_int(s: str) -> bool:
    try:
        return int(s) >= 1
    except ValueError:
        return False


BAD_COUNT = st.one_of(st.integers(max_value=0).map(str), TEXT.filter(lambda s: not _positive_int(s.strip())))
"""Where a count of at least 1 goes."""
BAD_POSITIVE = st.one_of(st.floats(max_value=0.0, allow_nan=False).map(repr),
                         st.sampled_from(["nan", "inf", "-inf"]),
                         TEXT.filter(lambda s: not _is_number(s.strip())))
"""Where a finite number above 0 goes."""


def _not_an_object(s: str) -> bool:
    try:
        return not isinstance(json.loads(s), dict)
    except ValueError:
        return True


BAD_JSON_OBJECT = st.one_of(TEXT.filter(_not_an_object),
                            st.sampled_from(["[]", "1", '"x"', "{", '{"a": ', "null", "true"]))
BAD_ENV_ID = TEXT.map(lambda s: f"NoSuchEnv{s}")
MISSING = TEXT.map(lambda s: f"/nonexistent-{s.replace('/', '_')}")

# (program, argv with one "{}" slot, what fills it); {out} is a fresh folder that must stay empty
CASES = {
    "vla-envs rollout <id>": ("vla_envs.cli", ["rollout", "{}"], BAD_ENV_ID),
    "vla-envs rollout --num-envs": ("vla_envs.cli", ["rollout", "vla/PickCube-v1", "--num-envs", "{}"], BAD_COUNT),
    "vla-envs collect-demos --env-kwargs": (
        "vla_envs.cli", ["collect-demos", "PutOnPlateInScene25Main-v3", "--out", "{out}/d", "--env-kwargs", "{}"],
        BAD_JSON_OBJECT),
    "vla-envs collect-demos --image-size": (
        "vla_envs.cli", ["collect-demos", "PutOnPlateInScene25Main-v3", "--out", "{out}/d", "--image-size", "{}"],
        BAD_COUNT),
    "vla-train --config": ("vla_trainer.cli.train", ["--config", "{}", "--run-dir", "{out}/r"], MISSING),
    "vla-train sft --demos": ("vla_trainer.cli.train", ["sft", "--demos", "{}", "--out", "{out}/s"], MISSING),
    "vla-train sft --steps": ("vla_trainer.cli.train", ["sft", "--demos", SHIPPED, "--out", "{out}/s", "--steps", "{}"],
                              BAD_COUNT),
    "vla-eval --checkpoint": ("vla_trainer.cli.eval", ["--checkpoint", "{}", "--out", "{out}/e"], MISSING),
    "vla-eval --task": ("vla_trainer.cli.eval", ["--checkpoint", SHIPPED, "--task", "{}", "--out", "{out}/e"],
                        BAD_ENV_ID),
    "vla-eval --num-envs": ("vla_trainer.cli.eval", ["--checkpoint", SHIPPED, "--num-envs", "{}", "--out", "{out}/e"],
                            BAD_COUNT),
    "vla-eval --num-episodes": ("vla_trainer.cli.eval",
                                ["--checkpoint", SHIPPED, "--num-episodes", "{}", "--out", "{out}/e"], BAD_COUNT),
    "vla-eval --temperature": ("vla_trainer.cli.eval",
                               ["--checkpoint", SHIPPED, "--temperature", "{}", "--out", "{out}/e"], BAD_POSITIVE),
    "vla-eval --env-kwargs": ("vla_trainer.cli.eval",
                              ["--checkpoint", SHIPPED, "--env-kwargs", "{}", "--out", "{out}/e"], BAD_JSON_OBJECT),
    "vla-eval --top-k": ("vla_trainer.cli.eval", ["--checkpoint", SHIPPED, "--top-k", "{}", "--out", "{out}/e"],
                         st.integers(max_value=-1).map(str)),
    "vla-envs rollout --episodes": ("vla_envs.cli", ["rollout", "vla/PickCube-v1", "--episodes", "{}"],
                                    st.integers(max_value=-1).map(str)),
    "vla-envs rollout --video": ("vla_envs.cli", ["rollout", "vla/PickCube-v1", "--video", "{}"],
                                 TEXT.filter(lambda s: not s.lower().endswith(".mp4"))),
    "vla-calibrate board --squares-x": ("calibration.cli", ["board", "--out", "{out}/b", "--squares-x", "{}"],
                                        BAD_COUNT),
    "vla-calibrate board --square-length-mm": (
        "calibration.cli", ["board", "--out", "{out}/b", "--square-length-mm", "{}"], BAD_POSITIVE),
    "vla-calibrate handeye --session": ("calibration.cli", ["handeye", "--session", "{}", "--out", "{out}/c.json"],
                                        MISSING),
    "franka-eval --checkpoint": ("vla_trainer.deploy.franka_eval",
                                 ["--checkpoint", "{}", "--robot-ip", "127.0.0.1", "--instruction", "x",
                                  "--dry-run", "--out", "{out}/f"], MISSING),
    "franka-eval --episodes": ("vla_trainer.deploy.franka_eval",
                               ["--checkpoint", SHIPPED, "--robot-ip", "127.0.0.1", "--instruction", "x",
                                "--dry-run", "--episodes", "{}", "--out", "{out}/f"], BAD_COUNT),
    "franka-eval --camera-crop": ("vla_trainer.deploy.franka_eval",
                                  ["--checkpoint", SHIPPED, "--robot-ip", "127.0.0.1", "--instruction", "x",
                                   "--dry-run", "--camera-crop", "{}", "--out", "{out}/f"],
                                  TEXT.filter(lambda s: s.count(",") != 3)),
    "vla-serve --port": ("vla_trainer.deploy.serve", ["--checkpoint", SHIPPED, "--port", "{}"],
                         st.one_of(st.integers(max_value=-1).map(str), st.integers(min_value=65536).map(str),
                                   TEXT.filter(lambda s: not s.strip().lstrip("-").isdigit()))),
}


def _run(module: str, argv: list[str], capsys) -> tuple[int, str]:
    import importlib

    main = importlib.import_module(module).main
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusals
        rc = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.reliability(fault="malformed command-line arguments (hypothesis)", cases=25,
                         outcome="refused: non-zero exit, an error line, no traceback, nothing written")
@pytest.mark.parametrize("case", list(CASES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_malformed_argument_is_refused_naming_it(case, data, tmp_path_factory, capsys):
    module, template, values = CASES[case]
    value = data.draw(values, label="value")
    out = tmp_path_factory.mktemp("out")
    argv = [value if a == "{}" else a.replace("{out}", str(out)) for a in template]
    rc, text = _run(module, argv, capsys)
    assert rc not in (0, None), f"{case}: {value!r} was accepted"
    assert "Traceback" not in text, f"{case}: {value!r}:\n{text}"
    assert "error" in text.lower(), f"{case}: {value!r} gave no error line:\n{text}"
    assert not any(out.iterdir()), f"{case}: {value!r} wrote {sorted(out.iterdir())}"

