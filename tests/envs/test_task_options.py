"""Typed task options: ``gym.make(id, **options)`` checks a task's options before anything is built,
refuses a name that is neither the task's nor the vector env's, and the registry refuses the
training-only ones in an evaluation, here and in a recipe's loader."""

from __future__ import annotations

import ast
import inspect
from dataclasses import fields

import gymnasium as gym
import psutil
import pytest

import vla_envs  # noqa: F401  (registers the ids)
from vla_envs.backends.libero.options import LiberoOptions
from vla_envs.registry import TASKS
from vla_envs.tasks.put_on_plate.options import PutOnPlateOptions

OPTION_CLASSES = (PutOnPlateOptions, LiberoOptions)


@pytest.mark.parametrize("cls", OPTION_CLASSES, ids=lambda c: c.__name__)
def test_every_option_is_documented_where_it_is_declared(cls):
    body = ast.parse(inspect.getsource(cls)).body[0].body
    documented = {a.target.id for a, doc in zip(body, body[1:])
                  if isinstance(a, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)}
    assert documented == {f.name for f in fields(cls)}


@pytest.mark.parametrize("env_id, typo, meant", [
    ("PutOnPlateInScene25Main-v3", "low_ploy", "low_poly"),
    ("PutOnPlateInScene25Main-v3", "camera_corp", "camera_crop"),
    ("PutOnPlateInScene25EasyHeldOut-v3", "time_limt", "time_limit"),
    ("libero_goal", "settle_step", "settle_steps"),
    ("vla/PickCube-v1", "image_sise", "image_size"),  # no typed options: checked against its factory
    ("vla/PushCube-v1", "auto_rest", "auto_reset"),
    ("franka/PutOnPlate-v0", "robot_ipp", "robot_ip"),
])
def test_a_misspelt_option_is_refused_with_the_name_meant_before_anything_starts(env_id, typo, meant):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=rf"{env_id}: unknown option '{typo}' \(did you mean {meant}[,?]"):
        gym.make(env_id, num_envs=2, **{typo: 1})
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # no worker was started


def test_a_missing_required_option_is_named_before_anything_starts():
    with pytest.raises(ValueError, match=r"franka/PutOnPlate-v0: the option 'instruction' is required"):
        gym.make("franka/PutOnPlate-v0", num_envs=1, robot_ip="172.16.0.2")


@pytest.mark.parametrize("kwargs, message", [
    ({"image_size": 0}, r"image_size=0; a side in pixels"),
    ({"image_size": (64, 64, 3)}, r"image_size=\(64, 64, 3\)"),
    ({"camera_crop": (10, 0, 5, 20)}, r"camera_crop=.*left < right"),
    ({"camera_crop": (0, 0, 640)}, r"camera_crop=\(0, 0, 640\)"),
    ({"assets": "bridge"}, r"assets='bridge'; allowed: \['auto', 'official', 'procedural'\]"),
    ({"expert_start_phases": "lift"}, r"expert_start_phases='lift'; must be a list"),
    ({"low_poly": "yes"}, r"low_poly='yes'; true or false"),
    ({"native_render": 1}, r"native_render=1; true or false"),
])
def test_bad_values_name_the_option_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make("PutOnPlateInScene25Main-v3", num_envs=1, **kwargs)


def test_values_from_yaml_become_the_declared_types():
    options, rest = PutOnPlateOptions.split({"camera_crop": [190, 80, 460, 350], "image_size": [48, 64],
                                             "expert_start_phases": ["lift"], "reward_shaping": 1,
                                             "auto_reset": False, "sim_backend": "physx_cpu"})
    assert options.camera_crop == (190, 80, 460, 350) and options.image_hw == (48, 64)
    assert options.expert_start_phases == ("lift",) and options.reward_shaping == 1.0
    assert rest == {"auto_reset": False, "sim_backend": "physx_cpu"}  # the vector env's and the backend's


def test_the_registry_refuses_exactly_the_fields_marked_training_only():
    assert TASKS["PutOnPlateInScene25Main-v3"].training_only.keys() == {"sim_freq", "expert_start_phases"}
    assert TASKS["libero_130"].training_only.keys() == {"fast_render"}
    with pytest.raises(ValueError, match="sim_freq changes the physics.*never for evaluation"):
        gym.make("PutOnPlateInScene25Main-v3", num_envs=1, evaluation=True, sim_freq=100)
    TASKS["PutOnPlateInScene25Main-v3"].check_kwargs({"sim_freq": 100, "low_poly": True})  # training: allowed
    # an evaluation may name the defaults it runs with (the reference's 500 Hz physics)
    TASKS["PutOnPlateInScene25Main-v3"].check_kwargs({"sim_freq": 500, "expert_start_phases": []}, evaluation=True)
    TASKS["libero_130"].check_kwargs({"fast_render": False}, evaluation=True)


def test_a_recipe_with_a_bad_env_option_fails_when_loaded():
    from vla_trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"env.train.env_kwargs.unknown option 'lowpoly' \(did you mean low_poly"):
        load_config("cpu_ppo_tiny_put_on_plate", ["env.train.env_kwargs.lowpoly=true"])
    with pytest.raises(ConfigError, match=r"env.eval.env_kwargs.sim_freq .*never for evaluation"):
        load_config("cpu_ppo_tiny_put_on_plate", ["env.eval.env_kwargs.sim_freq=100"])
    with pytest.raises(ConfigError, match=r"env.train.env_kwargs.reward_mode='shaped'"):
        load_config("cpu_ppo_tiny_put_on_plate", ["env.train.env_kwargs.reward_mode=shaped"])
    assert load_config("cpu_ppo_tiny_put_on_plate", ["env.train.env_kwargs.sim_freq=100"]).env.train.env_kwargs[
        "sim_freq"] == 100
