"""Recipes: YAML over the typed defaults, ``key=value`` overrides, then the rules.

    cfg = load_config("maniskill_ppo_openvlaoft", ["actor.optim.lr=3e-5", "env.train.total_num_envs=8"])
    cfg.algorithm.clip_ratio_high  # 0.2, a typed dataclass field

A recipe is a shipped name (``recipe_names()``) or a path to a YAML file. A recipe may start with
``defaults: [other_recipe]`` to inherit another recipe and change a few keys.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import asdict
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .schema import TrainConfig

RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes"

CHOICES = {
    "algorithm.adv_type": ("gae", "grpo"),
    "algorithm.loss_type": ("actor_critic", "actor"),
    "actor.model.model_name": ("openvla", "openvla_oft"),
    "actor.model.precision": ("fp32",),
    "env.train.vectorization": ("pool", "serial"),
    "env.eval.vectorization": ("pool", "serial"),
    "cluster.runtime": ("ray", "local"),
}
LOGGER_BACKENDS = ("tensorboard", "wandb")


class ConfigError(ValueError):
    """A recipe or override is invalid; the message names the key and what is allowed."""


class ConfigWarning(UserWarning):
    """A recipe key is valid but has no effect in this configuration."""


def recipe_names(recipe_dir: Path = RECIPE_DIR) -> list[str]:
    return sorted(p.stem for p in recipe_dir.glob("*.yaml"))


def recipe_path(recipe: str | Path, recipe_dir: Path = RECIPE_DIR) -> Path:
    """The YAML file of a shipped recipe name (in ``recipe_dir``) or a path."""
    path = Path(recipe)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"recipe file {path} does not exist")
        return path
    shipped = recipe_dir / f"{recipe}.yaml"
    if not shipped.is_file():
        raise ConfigError(f"unknown recipe {str(recipe)!r}; shipped recipes: {', '.join(recipe_names(recipe_dir))} "
                          "(or pass a path to a .yaml file)")
    return shipped


def _explain(e: OmegaConfBaseException, where: str) -> ConfigError:
    key = getattr(e, "full_key", None)
    msg = str(e).splitlines()[0]
    return ConfigError(f"{where}: {key + ': ' if key else ''}{msg}")


def _read_yaml(path: Path, seen: tuple[Path, ...] = (), recipe_dir: Path = RECIPE_DIR):
    """The recipe's keys with its ``defaults`` chain merged in (parents first)."""
    if path in seen:
        raise ConfigError(f"recipe {path}: 'defaults' chain loops through {path.name}")
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends
        raise ConfigError(f"recipe {path} is not valid YAML: {e}") from None
    if not OmegaConf.is_dict(node):
        raise ConfigError(f"recipe {path} must be a mapping of keys, got {type(node).__name__}")
    if len(node) == 0:  # most likely a file not saved yet; its run would be the defaults, under another name
        raise ConfigError(f"recipe {path} is empty; a recipe sets keys (vla-train recipes lists the shipped ones)")
    parents = node.pop("defaults", [])
    if isinstance(parents, str):
        parents = [parents]
    merged = OmegaConf.create({})
    for parent in parents:
        parent = str(parent)
        if parent.endswith((".yaml", ".yml")) and not Path(parent).is_absolute():
            parent = str(path.parent / parent)  # relative to the recipe that names it
        merged = OmegaConf.merge(merged, _read_yaml(recipe_path(parent, recipe_dir), (*seen, path), recipe_dir))
    return OmegaConf.merge(merged, node)


def load_config(recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Defaults <- recipe <- overrides, type-checked, then ``validate``d.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, an override not of the form
            ``key=value``, or a rule of ``validate`` broken; the message names the key.
    """
    cfg = load_recipe(TrainConfig, recipe, overrides)
    validate(cfg)
    return cfg


def load_recipe(schema: type, recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                recipe_dir: Path = RECIPE_DIR):
    """An instance of the dataclass ``schema``: its defaults <- the recipe (a name in ``recipe_dir``
    or a YAML path) <- ``key=value`` overrides, type-checked by OmegaConf; a field's own checks
    (``__post_init__``) run as it is made, and their ``ValueError`` comes back as a ConfigError."""
    base = OmegaConf.structured(schema)
    where = "defaults"
    try:
        if recipe is not None:
            where = f"recipe {recipe}"
            base = OmegaConf.merge(base, _read_yaml(recipe_path(recipe, recipe_dir), recipe_dir=recipe_dir))
        for item in overrides:
            where = f"override {item!r}"
            if "=" not in item or not item.split("=", 1)[0].strip():
                raise ConfigError(f"{where}: expected key=value, e.g. actor.optim.lr=3e-5 (vla-train --help lists "
                                  "the commands)")
            key, value = (x.strip() for x in item.split("=", 1))
            try:
                if value.startswith("{"):  # a mapping replaces the old one (key={} empties it), as in Hydra
                    OmegaConf.update(base, key, OmegaConf.select(OmegaConf.from_dotlist([item]), key), merge=False)
                elif any(part.isdigit() for part in key.split(".")):  # into a list: stages.0.sft.steps=5
                    if OmegaConf.select(base, key.rsplit(".", 1)[0]) is None:
                        raise ConfigError(f"{where}: {key.rsplit('.', 1)[0]} does not exist")
                    OmegaConf.update(base, key, OmegaConf.from_dotlist([f"value={value}"]).value, merge=True)
                else:
                    base = OmegaConf.merge(base, OmegaConf.from_dotlist([item]))
            except TypeError:  # OmegaConf: a section set below a plain value (`actor.seed.x=1`)
                parent = key.rsplit(".", 1)[0]
                raise ConfigError(f"{where}: {parent} is a single value, not a section with keys; set "
                                  f"{parent}=VALUE") from None
        where = f"recipe {recipe}" + (f" with {' '.join(overrides)}" if overrides else "")
        return OmegaConf.to_object(base)
    except OmegaConfBaseException as e:
        raise _explain(e, where) from None
    except yaml.YAMLError as e:  # an override's value is parsed as YAML: `key=[` or `key="`
        problem = str(getattr(e, "problem", None) or e).splitlines()[0]
        raise ConfigError(f"{where}: the value is not valid YAML ({problem}); quote text, e.g. "
                          f"runner.logger.experiment_name='my run'") from None
    except ConfigError:
        raise
    except ValueError as e:  # a field's own check
        raise ConfigError(f"{where}: {e}") from None


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)


def parse_devices(spec: str, key: str) -> tuple[int, ...] | str:
    """``"all"`` or a device set like ``"0-3"`` / ``"0,2,5-6"`` -> sorted ids (``"all"`` kept)."""
    spec = str(spec).strip()
    if spec == "all":
        return "all"
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ConfigError(f"{key}={spec!r}: expected 'all' or device ids like '0-3' or '0,2,5-6'")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ConfigError(f"{key}={spec!r}: range {part!r} is empty (start > end)")
        ids.update(range(lo, hi + 1))
    if not ids:
        raise ConfigError(f"{key}={spec!r}: a component needs at least one device")
    return tuple(sorted(ids))


def placement_mode(cfg: TrainConfig) -> str:
    """colocated (all components on the same devices), disaggregated (pairwise disjoint) or
    hybrid (env and rollout disjoint, actor spanning both)."""
    p = cfg.cluster.component_placement
    env, rollout, actor = (parse_devices(getattr(p, k), f"cluster.component_placement.{k}")
                           for k in ("env", "rollout", "actor"))
    if env == rollout == actor:
        return "colocated"
    if "all" in (env, rollout, actor):
        raise ConfigError("cluster.component_placement: mix 'all' with explicit device ids only when "
                          f"all three are 'all'; got env={p.env!r} rollout={p.rollout!r} actor={p.actor!r}")
    e, r, a = set(env), set(rollout), set(actor)
    if not (e & r) and not (e & a) and not (r & a):
        return "disaggregated"
    if not (e & r) and e | r <= a:
        return "hybrid"
    raise ConfigError(
        "cluster.component_placement: allowed layouts are colocated (env = rollout = actor), "
        "disaggregated (pairwise disjoint) and hybrid (env and rollout disjoint, actor covering both); "
        f"got env={p.env!r} rollout={p.rollout!r} actor={p.actor!r}")


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def validate(cfg: TrainConfig) -> None:
    """The rules a typed schema cannot express. Raises ConfigError naming the key."""
    from vla_trainer.algorithms import validate_granularity

    values = {
        "algorithm.adv_type": cfg.algorithm.adv_type,
        "algorithm.loss_type": cfg.algorithm.loss_type,
        "actor.model.model_name": cfg.actor.model.model_name,
        "actor.model.precision": cfg.actor.model.precision,
        "env.train.vectorization": cfg.env.train.vectorization,
        "env.eval.vectorization": cfg.env.eval.vectorization,
        "cluster.runtime": cfg.cluster.runtime,
    }
    for key, value in values.items():
        _check(value in CHOICES[key], key, f"{value!r} is not one of {', '.join(map(repr, CHOICES[key]))}")
    for b in cfg.runner.logger.logger_backends:
        _check(b in LOGGER_BACKENDS, "runner.logger.logger_backends",
               f"{b!r} is not one of {', '.join(map(repr, LOGGER_BACKENDS))}")

    alg = cfg.algorithm
    try:
        validate_granularity(alg.reward_type, alg.logprob_type, alg.value_type)
    except ValueError as e:
        raise ConfigError(f"algorithm.reward_type / logprob_type / value_type: {e}") from None
    if alg.adv_type == "gae":
        _check(alg.loss_type == "actor_critic", "algorithm.loss_type",
               "adv_type 'gae' needs a critic: use loss_type 'actor_critic'")
        _check(cfg.actor.model.add_value_head, "actor.model.add_value_head",
               "adv_type 'gae' needs the value head: set it to true")
        for key in ("success_rate_filter", "length_normalization"):  # GRPO's, on its groups and trajectories
            if getattr(alg, key):
                warnings.warn(f"algorithm.{key}=true is ignored: it is GRPO's (adv_type 'grpo'); PPO with GAE "
                              "has neither groups nor per-trajectory weights; set it to false", ConfigWarning,
                              stacklevel=2)
    else:
        _check(alg.loss_type == "actor", "algorithm.loss_type", "adv_type 'grpo' has no critic: use loss_type 'actor'")
        if cfg.actor.model.add_value_head:
            warnings.warn("actor.model.add_value_head=true is ignored: GRPO (loss_type 'actor') trains no value "
                          "head; set it to false", ConfigWarning, stacklevel=2)
        _check(alg.group_size >= 2, "algorithm.group_size", f"GRPO compares trajectories within a group; "
               f"needs >= 2, got {alg.group_size}")
        _check(cfg.actor.optim.critic_warmup_steps == 0, "actor.optim.critic_warmup_steps",
               f"GRPO trains no critic: {cfg.actor.optim.critic_warmup_steps} warm-up iterations would update "
               "nothing; set it to 0")
    for key, value in (("algorithm.gamma", alg.gamma), ("algorithm.gae_lambda", alg.gae_lambda)):
        _check(0.0 <= value <= 1.0, key, f"must lie in [0, 1], got {value}")
    _check(0.0 <= alg.clip_ratio_low < 1.0, "algorithm.clip_ratio_low", f"must lie in [0, 1), got {alg.clip_ratio_low}")
    _check(alg.clip_ratio_high >= 0.0, "algorithm.clip_ratio_high", f"must be >= 0, got {alg.clip_ratio_high}")
    _check(alg.value_clip is None or alg.value_clip >= 0, "algorithm.value_clip", f"must be >= 0 or null, got {alg.value_clip}")
    _check(alg.huber_delta is None or alg.huber_delta > 0, "algorithm.huber_delta",
           f"must be > 0 or null, got {alg.huber_delta}")
    for key in ("entropy_bonus", "kl_beta", "value_loss_coef"):
        _check(getattr(alg, key) >= 0, f"algorithm.{key}", f"must be >= 0, got {getattr(alg, key)}")
    _check(alg.rollout_epoch >= 1, "algorithm.rollout_epoch", f"must be >= 1, got {alg.rollout_epoch}")
    _check(alg.update_epoch >= 1, "algorithm.update_epoch", f"must be >= 1, got {alg.update_epoch}")
    _check((alg.filter_low is None) == (alg.filter_high is None), "algorithm.filter_low",
           f"set both algorithm.filter_low and filter_high, or neither (null: drop the groups whose "
           f"trajectories all scored the same); got {alg.filter_low} and {alg.filter_high}")
    _check(alg.filter_low is None or alg.filter_low <= alg.filter_high, "algorithm.filter_low",
           f"must be <= algorithm.filter_high ({alg.filter_low} > {alg.filter_high})")
    if alg.filter_low is not None and not alg.success_rate_filter:
        warnings.warn(f"algorithm.filter_low / filter_high ({alg.filter_low}, {alg.filter_high}) are ignored: "
                      "algorithm.success_rate_filter is false; set it to true to filter", ConfigWarning, stacklevel=2)
    _check(alg.bc_coef >= 0, "algorithm.bc_coef", f"must be >= 0 (0: off), got {alg.bc_coef}")
    _check(alg.bc_batch_size >= 0, "algorithm.bc_batch_size",
           f"must be >= 0 (0: actor.micro_batch_size), got {alg.bc_batch_size}")
    _check(alg.bc_coef == 0 or alg.bc_demo_dirs, "algorithm.bc_demo_dirs",
           f"bc_coef={alg.bc_coef} needs demonstrations: set it to a list of vla-envs collect-demos folders")
    if alg.bc_demo_dirs and alg.bc_coef == 0:
        warnings.warn("algorithm.bc_demo_dirs are ignored: algorithm.bc_coef is 0 (the behaviour-cloning term "
                      "is off); set bc_coef > 0 to train on them", ConfigWarning, stacklevel=2)
    sp = alg.sampling_params
    for key in ("temperature_train", "temperature_eval"):
        _check(_positive(getattr(sp, key)), f"algorithm.sampling_params.{key}",
               f"must be a finite number > 0, got {getattr(sp, key)}")
    _check(sp.top_k >= 0, "algorithm.sampling_params.top_k", f"must be >= 0 (0: off), got {sp.top_k}")
    _check(alg.kl_beta == 0 or sp.top_k == 0, "algorithm.kl_beta",
           f"a KL penalty ({alg.kl_beta}) needs algorithm.sampling_params.top_k=0 (got {sp.top_k}): under "
           "top-k, a sampled token outside the reference policy's top-k has log-prob -inf there and the "
           "KL estimate is not finite")

    train, ev = cfg.env.train, cfg.env.eval
    for split, env in (("train", train), ("eval", ev)):
        _check(env.total_num_envs >= 1, f"env.{split}.total_num_envs", f"must be >= 1, got {env.total_num_envs}")
        _check(env.max_episode_steps is None or env.max_episode_steps >= 1, f"env.{split}.max_episode_steps",
               f"must be >= 1 or null, got {env.max_episode_steps}")
        _check(math.isfinite(env.reward_coef), f"env.{split}.reward_coef", f"must be finite, got {env.reward_coef}")
    from vla_envs.errors import VlaEnvError
    from vla_envs.registry import get_task  # the task checks its options, and which only training may use

    for split, env in (("train", train), ("eval", ev)):
        try:
            spec = get_task(env.task)
        except VlaEnvError as e:
            raise ConfigError(f"env.{split}.task: {e}") from None
        try:
            spec.check_kwargs(dict(env.env_kwargs), evaluation=split == "eval", where=f"env.{split}.env_kwargs.")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        limit = env.max_episode_steps or spec.max_episode_steps
        if split == "train" and not env.auto_reset and cfg.rollout.steps_per_rollout > limit:
            warnings.warn(f"rollout.steps_per_rollout={cfg.rollout.steps_per_rollout} is longer than an episode "
                          f"({limit} steps) and env.train.auto_reset is false: every env is idle after its "
                          f"episode, {cfg.rollout.steps_per_rollout - limit} steps of each rollout; set it to "
                          f"{limit}, or auto_reset to true", ConfigWarning, stacklevel=2)
    _check(ev.num_episodes >= 1 and ev.num_episodes % ev.total_num_envs == 0, "env.eval.num_episodes",
           f"must be a positive multiple of env.eval.total_num_envs ({ev.total_num_envs}), got {ev.num_episodes}")
    _check(alg.group_size >= 1, "algorithm.group_size", f"must be >= 1, got {alg.group_size}")
    _check(train.total_num_envs % alg.group_size == 0, "algorithm.group_size",
           f"{alg.group_size} does not divide env.train.total_num_envs ({train.total_num_envs})")
    if alg.adv_type == "grpo":
        _check(train.use_fixed_reset_state_ids, "env.train.use_fixed_reset_state_ids",
               "GRPO groups must share initial states: set it to true")
    k = cfg.rollout.pipeline_stage_num
    _check(k >= 1 and train.total_num_envs % k == 0, "rollout.pipeline_stage_num",
           f"must be >= 1 and divide env.train.total_num_envs ({train.total_num_envs}), got {k}")
    _check(cfg.rollout.steps_per_rollout >= 1, "rollout.steps_per_rollout",
           f"must be >= 1, got {cfg.rollout.steps_per_rollout}")

    actor = cfg.actor
    _check(actor.micro_batch_size >= 1, "actor.micro_batch_size", f"must be >= 1, got {actor.micro_batch_size}")
    _check(actor.global_batch_size >= actor.micro_batch_size and actor.global_batch_size % actor.micro_batch_size == 0,
           "actor.global_batch_size", f"must be a multiple of actor.micro_batch_size ({actor.micro_batch_size}), "
           f"got {actor.global_batch_size}")
    m = actor.model
    _check(m.model_path is not None or m.preset is not None, "actor.model.preset",
           "no model: set actor.model.model_path=<checkpoint folder> (or a tiny preset, e.g. actor.model.preset=tiny-openvla-oft)")
    if m.model_path is None:
        from vla_trainer.models import PRESETS

        _check(m.preset in PRESETS, "actor.model.preset", f"{m.preset!r} is not one of {sorted(PRESETS)}")
        _check((m.model_name == "openvla_oft") == ("oft" in m.preset), "actor.model.model_name",
               f"{m.model_name!r} does not match preset {m.preset!r}")
    _check(m.lora_rank >= 1, "actor.model.lora_rank", f"must be >= 1, got {m.lora_rank}")
    _check(actor.seed >= 0, "actor.seed", f"must be >= 0 (torch and numpy seeds are unsigned), got {actor.seed}")
    o = actor.optim
    for key in ("lr", "value_lr", "adam_eps", "clip_grad"):
        _check(_positive(getattr(o, key)), f"actor.optim.{key}", f"must be a finite number > 0, got {getattr(o, key)}")
    for key in ("adam_beta1", "adam_beta2"):
        _check(0.0 <= getattr(o, key) < 1.0, f"actor.optim.{key}", f"must lie in [0, 1), got {getattr(o, key)}")
    _check(math.isfinite(o.weight_decay) and o.weight_decay >= 0, "actor.optim.weight_decay",
           f"must be a finite number >= 0, got {o.weight_decay}")
    _check(o.critic_warmup_steps >= 0, "actor.optim.critic_warmup_steps", f"must be >= 0, got {o.critic_warmup_steps}")
    r = cfg.runner
    _check(r.max_epochs >= 1, "runner.max_epochs", f"must be >= 1, got {r.max_epochs}")
    _check(r.max_wall_minutes is None or _positive(r.max_wall_minutes), "runner.max_wall_minutes",
           f"must be > 0 or null (no limit), got {r.max_wall_minutes}")
    _check(r.val_check_interval == -1 or r.val_check_interval >= 1, "runner.val_check_interval",
           f"must be >= 1 or -1 (never), got {r.val_check_interval}")
    _check(r.save_interval == -1 or r.save_interval >= 1, "runner.save_interval",
           f"must be >= 1 or -1 (only at the end), got {r.save_interval}")
    c = cfg.cluster
    _check(c.num_nodes >= 1, "cluster.num_nodes", f"must be >= 1, got {c.num_nodes}")
    _check(c.num_devices is None or c.num_devices >= 1, "cluster.num_devices",
           f"must be >= 1 or null (auto), got {c.num_devices}")
    _check(c.max_restarts >= 0, "cluster.max_restarts", f"must be >= 0, got {c.max_restarts}")
    mode = placement_mode(cfg)
    _check(c.runtime == "ray" or mode == "colocated", "cluster.runtime",
           f"'local' runs every component in one process, which is the colocated layout; the "
           f"{mode} placement needs cluster.runtime=ray")


def check_batch_sizes(cfg: TrainConfig, chunk_size: int) -> int:
    """Rules that need the model's chunk size. Returns the samples (chunks) per rollout."""
    steps = cfg.rollout.steps_per_rollout
    _check(steps % chunk_size == 0, "rollout.steps_per_rollout",
           f"{steps} is not a multiple of the model's chunk size {chunk_size}")
    samples = cfg.env.train.total_num_envs * steps // chunk_size * cfg.algorithm.rollout_epoch
    g = cfg.actor.global_batch_size
    _check(samples % g == 0, "actor.global_batch_size",
           f"{g} does not divide the {samples} samples of an update (env.train.total_num_envs x "
           "rollout.steps_per_rollout / chunk size x algorithm.rollout_epoch)")
    return samples
