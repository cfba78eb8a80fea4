"""``ChunkVectorEnv``: the one env contract every backend (ManiSkill, LIBERO, Franka) adapts to.

Vocabulary:
    episode: from a reset to the sub-step where ``terminated`` or ``truncated`` is True.
    chunk: ``C`` consecutive actions predicted at once by a policy; ``chunk_step`` executes
        them as ``C`` sub-steps.
    valid[i, j]: sub-step ``j`` of env ``i`` belongs to the episode that was running when the
        chunk started (env ``i`` had not finished earlier in the chunk). Only valid sub-steps
        carry the policy's intent; a trainer masks the rest.

Time limits, auto-reset, chunk semantics, initial-state ids and episode metrics are decided
here, once; a ``BatchedBackend`` only simulates.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from vla_envs.core.backend import BatchedBackend
from vla_envs.core.spaces import array_keys
from vla_envs.errors import ClosedEnvError

ChunkReset = Literal["end_of_chunk", "immediate"]
OutOfRange = Literal["clip", "raise"]
_RESET_OPTIONS = ("reset_mask", "state_ids")
EPISODE_METRICS = ("success_once", "success_at_end", "return", "length")  # plus <flag>_once per progress flag
_EXHAUSTED = -2  # drawn id meaning "no initial state left" (enumerate_initial_states)


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0]


class ChunkStepResult(NamedTuple):
    """What ``chunk_step`` returns. Arrays are ``[N, C]`` except ``obs`` and ``info``."""

    obs: dict[str, Any]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    info: dict[str, Any]


class ChunkVectorEnv(VectorEnv, gym.Env):
    """A chunk-aware vectorized env following Gymnasium's vector API.

    It is also a ``gymnasium.Env`` only so that ``gym.make(id, num_envs=N)`` returns it
    (as ManiSkill's batched envs do); its semantics are those of a ``VectorEnv``.

    Args:
        backend: the simulator batch.
        auto_reset: reset envs whose episode ended (partial reset: only those envs). The final
            observation and info are kept in ``info["final_obs"]`` / ``info["final_info"]``
            (Gymnasium's SAME_STEP timing; ``final_obs`` is a dict of ``[N, ...]`` arrays whose rows
            are valid where ``info["_final_obs"]``, not Gymnasium's per-env object array). When
            False, a finished env stays finished (its sub-steps are invalid, rewards 0) until
            ``reset`` is called for it.
        ignore_terminations: episodes end only at the time limit; ``terminated`` is always
            False and ``success_at_end`` tells whether the task was solved at the last step.
        chunk_reset: when an env finishes inside a chunk, ``"end_of_chunk"`` resets it after
            the chunk's last sub-step; ``"immediate"`` resets it at once.
        skip_finished_actions: do not execute an env's remaining actions of a chunk once its
            episode has finished. Default: True where the backend can leave envs untouched.
            With False, ``"end_of_chunk"`` executes them in the finished episode (ignored)
            and ``"immediate"`` executes them in the new episode (counted in its metrics,
            reported with ``valid`` False; should it end too, it is reported in
            ``info["later_episodes"]``, see ``chunk_step``).
        use_fixed_reset_state_ids: envs are grouped by ``group_size`` (envs ``[g*G, (g+1)*G)``)
            and every member of a group starts its k-th episode from the same initial-state
            id, drawn from the seeded generator (GRPO groups).
        group_size: envs per group; must divide ``num_envs``.
        action_out_of_range: ``"clip"`` (default) clips actions to [-1, 1];
            ``"raise"`` rejects them with a ValueError.
        time_limit: override the task's time limit (steps per episode); the value in force
            is ``env.max_episode_steps``.
        enumerate_initial_states: ordered evaluation: each reset (including auto-resets) takes
            the next unused initial-state id, ``0, 1, 2, ...`` across all envs (or the next of
            a given sequence of ids), until every id has run exactly once; envs then stay idle
            (``valid`` False) and ``env.exhausted`` turns True when the last episode ends.
            ``reset(seed=...)`` starts over. ``info["episode_state_id"]`` names the initial
            state of each finished episode.
        first_env_index: global index of this batch's env 0 when it is one slice of a larger
            batch (a pipeline stage, a worker's share). Initial-state ids are drawn per env
            (per group with ``use_fixed_reset_state_ids``) from the reset seed and the global
            index, so a slice draws exactly what the same envs of one big batch would. (Not ``max_episode_steps=``: ``gym.make`` takes that
            name for its own single-env TimeLimit wrapper.)

    Example:
        >>> import gymnasium as gym, vla_envs  # doctest: +SKIP
        >>> env = gym.make("PickCube-v1", num_envs=2)  # doctest: +SKIP
        >>> obs, info = env.reset(seed=0)  # doctest: +SKIP
        >>> out = env.chunk_step(np.zeros((2, 4, 7), np.float32))  # doctest: +SKIP
        >>> out.rewards.shape, out.valid.dtype  # doctest: +SKIP
        ((2, 4), dtype('bool'))
    """

    def __init__(
        self,
        backend: BatchedBackend,
        *,
        auto_reset: bool = True,
        ignore_terminations: bool = False,
        chunk_reset: ChunkReset = "end_of_chunk",
        skip_finished_actions: bool | None = None,
        use_fixed_reset_state_ids: bool = False,
        group_size: int = 1,
        action_out_of_range: OutOfRange = "clip",
        time_limit: int | None = None,
        enumerate_initial_states: bool | Sequence[int] = False,
        first_env_index: int = 0,
    ):
        self.backend = backend
        n = backend.num_envs
        if chunk_reset not in ("end_of_chunk", "immediate"):
            raise ValueError(f"chunk_reset={chunk_reset!r}; allowed: 'end_of_chunk', 'immediate'")
        if action_out_of_range not in ("clip", "raise"):
            raise ValueError(
                f"action_out_of_range={action_out_of_range!r}; allowed: 'clip', 'raise'"
            )
        # true / false only: bool("false") is True, and these decide grouping and when episodes end
        for name, value in (("auto_reset", auto_reset), ("ignore_terminations", ignore_terminations),
                            ("use_fixed_reset_state_ids", use_fixed_reset_state_ids),
                            ("skip_finished_actions", skip_finished_actions)):
            if not isinstance(value, (bool, np.bool_)) and not (name == "skip_finished_actions" and value is None):
                raise ValueError(f"{name}={value!r}; allowed: True or False"
                                 + (" (or None: the backend's choice)" if name == "skip_finished_actions" else ""))
        if skip_finished_actions is None:
            skip_finished_actions = backend.can_skip_envs
        if skip_finished_actions and not backend.can_skip_envs:
            raise ValueError(
                f"skip_finished_actions=True but the {type(backend).__name__} backend steps "
                "every env at once; use skip_finished_actions=False"
            )
        if not isinstance(group_size, (int, np.integer)) or group_size < 1 or n % group_size:
            raise ValueError(
                f"group_size={group_size!r} must be a positive integer dividing num_envs={n}"
            )
        if not isinstance(first_env_index, (int, np.integer)) or first_env_index < 0 or first_env_index % group_size:
            raise ValueError(f"first_env_index={first_env_index!r} must be a non-negative multiple of "
                             f"group_size={group_size}")
        if time_limit is not None and (not isinstance(time_limit, (int, np.integer)) or isinstance(time_limit, bool)
                                       or time_limit < 1):
            raise ValueError(f"time_limit={time_limit!r} must be a positive integer (steps)")

        self.num_envs = n
        self.single_observation_space = backend.single_observation_space
        self.single_action_space = backend.single_action_space
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.auto_reset = bool(auto_reset)
        self.ignore_terminations = bool(ignore_terminations)
        self.chunk_reset = chunk_reset
        self.skip_finished_actions = bool(skip_finished_actions)
        self.use_fixed_reset_state_ids = bool(use_fixed_reset_state_ids)
        self.group_size = int(group_size)
        self.action_out_of_range = action_out_of_range
        self.max_episode_steps = int(time_limit or backend.max_episode_steps)
        self.metadata = {
            "autoreset_mode": AutoresetMode.SAME_STEP if auto_reset else AutoresetMode.DISABLED,
            "render_modes": [],
        }
        self.render_mode = None
        self.closed = False

        self._array_keys = array_keys(self.single_observation_space)
        self._obs: dict[str, np.ndarray] = {
            k: np.zeros((n,) + self.single_observation_space[k].shape,
                        self.single_observation_space[k].dtype)
            for k in self._array_keys
        }
        self._instructions: list[str] = [""] * n
        self._live = np.zeros(n, bool)  # env has an episode running
        # envs that must be reset before the next step, and why: never reset yet, or their records
        # may disagree with their simulators (a chunk step or a reset failed part way)
        self._needs_reset = np.ones(n, bool)
        self._needs_reset_why = "were never reset"
        self._elapsed = np.zeros(n, np.int64)
        self._return = np.zeros(n, np.float64)
        self._success_once = np.zeros(n, bool)
        self._last_success = np.zeros(n, bool)
        self.progress_flags: tuple[str, ...] = tuple(getattr(backend, "progress_flags", ()))
        self.episode_counters: tuple[str, ...] = tuple(getattr(backend, "episode_counters", ()))
        self.episode_metrics = (EPISODE_METRICS + tuple(f"{name}_once" for name in self.progress_flags)
                                + self.episode_counters)
        self._progress_once = {name: np.zeros(n, bool) for name in self.progress_flags}
        self._counts = {name: np.zeros(n, np.int64) for name in self.episode_counters}
        self._state_id = np.full(n, -1, np.int64)
        self.first_env_index = int(first_env_index)
        self.enumerate_initial_states = enumerate_initial_states is not False
        self._enumeration = self._check_enumeration(enumerate_initial_states)
        self._next_state_id = 0
        self._finished_state_id = np.full(n, -1, np.int64)
        self._seed_rngs(None)
        self._episode_index = np.zeros(n, np.int64)
        self._group_ids: list[list[int]] = [[] for _ in range(n // self.group_size)]
        self._group_base = np.zeros(n // self.group_size, np.int64)
        self._observers: list[Callable[[dict[str, Any]], None]] = []

    # ------------------------------------------------------------------ reset
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset all envs, or the subset in ``options["reset_mask"]``.

        Args:
            seed: seeds the generator of initial-state ids; the same seed gives the same
                sequence of initial states. None continues the current generator.
            options: ``reset_mask`` (bool ``[N]``): reset only these envs;
                ``state_ids`` (int ``[N]``): pin the initial-state id of each reset env
                (``-1``: draw as usual).

        Returns:
            ``(obs, info)``; ``info["state_id"]`` is each env's initial-state id.
        """
        self._check_open()
        options = dict(options or {})
        unknown = sorted(set(options) - set(_RESET_OPTIONS))
        if unknown:
            raise ValueError(f"unknown reset option(s) {unknown}; allowed: {list(_RESET_OPTIONS)}")
        if seed is not None:
            if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
                raise TypeError(
                    f"seed must be an int or None, got {type(seed).__name__}; one seed drives "
                    "every env's initial state"
                )
            self._seed_rngs(int(seed))
            self._next_state_id = 0
            self._episode_index[:] = 0
            self._group_ids = [[] for _ in self._group_ids]
            self._group_base[:] = 0
        mask = self._check_reset_mask(options.get("reset_mask"))
        pinned = self._check_state_ids(options.get("state_ids"))
        env_ids = np.flatnonzero(mask)
        self._reset_envs(env_ids, pinned[env_ids])
        return self._current_obs(), {"state_id": self._state_id.copy()}

    def _check_enumeration(self, spec: Any) -> np.ndarray:
        k = self.backend.num_initial_states
        if spec is False or spec is True:
            return np.arange(k if spec else 0)
        ids = np.asarray(spec)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu" or (ids < 0).any() or (ids >= k).any():
            raise ValueError(f"enumerate_initial_states must be True or a non-empty sequence of initial-state "
                             f"ids in 0..{k - 1}")
        return ids.astype(np.int64)

    def _seed_rngs(self, seed: int | None) -> None:
        # one generator per env (per group with fixed ids), keyed by the global index
        root = np.random.SeedSequence(seed)
        first, n, g = self.first_env_index, self.num_envs, self.group_size
        child = lambda kind, i: np.random.default_rng(  # noqa: E731
            np.random.SeedSequence(root.entropy, spawn_key=(kind, i)))
        self._env_rngs = [child(0, first + i) for i in range(n)]
        self._group_rngs = [child(1, first // g + j) for j in range(n // g)]

    def _check_reset_mask(self, mask: Any) -> np.ndarray:
        n = self.num_envs
        if mask is None:
            return np.ones(n, bool)
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"reset_mask must be a numpy array, got {type(mask).__name__}")
        if mask.shape != (n,) or mask.dtype != np.bool_:
            raise ValueError(
                f"reset_mask must be bool with shape ({n},), got {mask.dtype} {mask.shape}"
            )
        if not mask.any():
            raise ValueError("reset_mask selects no env; at least one must be True")
        return mask

    def _check_state_ids(self, ids: Any) -> np.ndarray:
        n, k = self.num_envs, self.backend.num_initial_states
        if ids is None:
            return np.full(n, -1, np.int64)
        ids = np.asarray(ids)
        if ids.shape != (n,) or ids.dtype.kind not in "iu":
            raise ValueError(f"state_ids must be integers with shape ({n},), got {ids.dtype} {ids.shape}")
        bad = np.flatnonzero((ids < -1) | (ids >= k))
        if bad.size:
            raise ValueError(
                f"state_ids out of range for env(s) {bad.tolist()}: {ids[bad].tolist()}; "
                f"allowed: 0..{k - 1}, or -1 to draw"
            )
        return ids.astype(np.int64)

    def _draw_state_ids(self, env_ids: np.ndarray, pinned: np.ndarray) -> np.ndarray:
        ids = pinned.copy()
        k = self.backend.num_initial_states
        for pos, i in enumerate(env_ids):
            episode = self._episode_index[i]
            self._episode_index[i] += 1
            if ids[pos] >= 0:
                continue
            if self.enumerate_initial_states:
                e = self._enumeration
                ids[pos] = e[self._next_state_id] if self._next_state_id < len(e) else _EXHAUSTED
                self._next_state_id += 1
                continue
            if not self.use_fixed_reset_state_ids:
                ids[pos] = self._env_rngs[i].integers(k)
                continue
            g = i // self.group_size
            drawn = self._group_ids[g]
            while self._group_base[g] + len(drawn) <= episode:
                drawn.append(int(self._group_rngs[g].integers(k)))
            ids[pos] = drawn[episode - self._group_base[g]]
            # Forget ids every member of the group has already used.
            members = self._episode_index[g * self.group_size:(g + 1) * self.group_size]
            used = int(members.min()) - self._group_base[g]
            if used > 0:
                del drawn[:used]
                self._group_base[g] += used
        return ids

    def _reset_envs(self, env_ids: np.ndarray, pinned: np.ndarray) -> None:
        if env_ids.size == 0:
            return
        state_ids = self._draw_state_ids(env_ids, pinned)
        idle = state_ids == _EXHAUSTED  # enumeration done: these envs run no further episode
        self._needs_reset[env_ids[idle]] = False
        self._live[env_ids[idle]] = False
        self._state_id[env_ids[idle]] = -1
        env_ids, state_ids = env_ids[~idle], state_ids[~idle]
        if env_ids.size == 0:
            return
        try:
            obs, instructions = self.backend.reset(env_ids, state_ids)
        except BaseException as e:  # some of them may have been reset, their records not
            self._needs_reset[env_ids] = True
            self._needs_reset_why = (f"were not reset since their reset failed ({_first_line(e)}): their simulators "
                                     "may have moved without being counted")
            raise
        self._needs_reset[env_ids] = False
        for key in self._array_keys:
            self._obs[key][env_ids] = obs[key]
        for i, text in zip(env_ids, instructions):
            self._instructions[i] = text
        self._state_id[env_ids] = state_ids
        self._live[env_ids] = True
        self._elapsed[env_ids] = 0
        self._return[env_ids] = 0.0
        self._success_once[env_ids] = False
        self._last_success[env_ids] = False
        for once in self._progress_once.values():
            once[env_ids] = False
        for count in self._counts.values():
            count[env_ids] = 0

    # ------------------------------------------------------------------ stepping
    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One action per env: ``actions`` float ``[N, 7]``.

        Returns:
            ``(obs, rewards[N], terminated[N], truncated[N], info)``. ``info["success"]``
            and each of the task's ``progress_flags`` (``info["grasped"]``) are bool ``[N]``.
            Finished episodes' metrics (``env.episode_metrics``: success_once,
            success_at_end, return, length and ``<flag>_once`` per progress flag) are in
            ``info["episode"]`` (mask ``info["_episode"]``).
        """
        actions = self._check_actions(actions, chunked=False)
        out = self._run_chunk(actions[:, None, :])
        info = out.info
        for key in ("success",) + self.progress_flags:
            info[key] = info[key][:, 0]
        return out.obs, out.rewards[:, 0], out.terminated[:, 0], out.truncated[:, 0], info

    def chunk_step(self, actions: Any) -> ChunkStepResult:
        """Execute an action chunk ``actions`` float ``[N, C, 7]`` as ``C`` sub-steps.

        Returns:
            ``ChunkStepResult(obs, rewards[N, C], terminated[N, C], truncated[N, C],
            valid[N, C], info)``. Invalid sub-steps report reward 0 and False flags, except
            under ``chunk_reset="immediate"`` without skipping, where they report the new
            episode's values. ``info["success"]`` and each progress flag are bool ``[N, C]``.

            Finished episodes: ``info["episode"]`` (mask ``info["_episode"]``; the other rows
            are zeros), ``info["episode_state_id"]`` (-1 in the other rows) and, with auto-reset, ``info["final_obs"]`` /
            ``info["final_info"]`` describe the *first* episode each env finished in the chunk:
            the one the chunk was planned for, whose last sub-step is valid (the one a trainer
            bootstraps). Under ``chunk_reset="immediate"`` without skipping, an env can finish
            more episodes on the chunk's leftover (invalid) sub-steps; each of those is one
            record of the list ``info["later_episodes"]`` (present only then):
            ``{"env": i, "sub_step": j, "episode": {metric: value}, "episode_state_id": id,
            "final_obs": {key: array, "instruction": str}, "truncation_reason": str}``. Nothing is
            overwritten: ``info["truncation_reason"]`` (when any sub-step truncated) is per env the
            reason of the episode ``info["episode"]`` reports (``"time_limit"``, ``"worker_crashed"``,
            or ``""``: terminated or still running).
        """
        return self._run_chunk(self._check_actions(actions, chunked=True))

    def _run_chunk(self, actions: np.ndarray) -> ChunkStepResult:
        self._check_open()
        if self._needs_reset.any():
            raise RuntimeError(
                f"env(s) {np.flatnonzero(self._needs_reset).tolist()} {self._needs_reset_why}; call reset() first "
                f"(or reset only them with options={{'reset_mask': mask}})"
            )
        try:
            return self._step_chunk(actions)
        except BaseException as e:
            # the backend may have stepped some envs (a pool's other workers) whose records did not
            # move, or ended episodes it did not reset: none of their records can be trusted now
            self._needs_reset[:] = True
            self._needs_reset_why = (f"were not reset since a chunk step failed part way ({_first_line(e)}): their "
                                     "simulators may have moved without being counted")
            raise

    def _step_chunk(self, actions: np.ndarray) -> ChunkStepResult:
        n, c = actions.shape[:2]
        rewards = np.zeros((n, c), np.float32)
        terminated = np.zeros((n, c), bool)
        truncated = np.zeros((n, c), bool)
        valid = np.zeros((n, c), bool)
        success = np.zeros((n, c), bool)
        progress = {name: np.zeros((n, c), bool) for name in self.progress_flags}
        in_chunk_episode = self._live.copy()  # the episode the chunk was planned for runs on
        finished = np.zeros(n, bool)
        episode = {k: np.zeros(n, dt) for k, dt in zip(EPISODE_METRICS, (bool, bool, np.float64, np.int64))}
        episode |= {f"{name}_once": np.zeros(n, bool) for name in self.progress_flags}
        episode |= {name: np.zeros(n, np.int64) for name in self.episode_counters}
        final_obs: dict[str, Any] = {k: np.zeros_like(v) for k, v in self._obs.items()}
        final_obs["instruction"] = [""] * n
        final_success = np.zeros(n, bool)
        reason = np.full(n, "", dtype=object)
        later: list[dict[str, Any]] = []  # episodes an env finished after its first one in this chunk
        self._finished_state_id[:] = -1  # as every masked info entry: only this chunk's episodes fill it

        for j in range(c):
            valid[:, j] = in_chunk_episode
            active = in_chunk_episode.copy() if self.skip_finished_actions else np.ones(n, bool)
            result = self.backend.step(actions[:, j], active)
            stepped = active & self._live
            idx = np.flatnonzero(stepped)
            for key in self._array_keys:
                self._obs[key][idx] = result.obs[key][idx]
            self._elapsed[idx] += 1
            self._return[idx] += result.reward[idx]
            self._success_once[idx] |= result.success[idx]
            self._last_success[idx] = result.success[idx]
            for name, once in self._progress_once.items():
                once[idx] |= result.info[name][idx]
                progress[name][idx, j] = result.info[name][idx]
            for name, count in self._counts.items():
                count[idx] += result.info[name][idx]
            rewards[idx, j] = result.reward[idx]
            success[idx, j] = result.success[idx]
            if not self.ignore_terminations:
                terminated[idx, j] = result.terminated[idx]
            truncated[idx, j] = self._elapsed[idx] >= self.max_episode_steps
            step_reason = np.where(truncated[:, j], "time_limit", "").astype(object)
            if "crashed" in result.info:  # the simulator was replaced: this episode cannot go on
                lost = result.info["crashed"] & self._live
                truncated[lost, j] = True
                terminated[lost, j] = False
                step_reason[lost] = "worker_crashed"
            ended = terminated[:, j] | truncated[:, j]
            done = np.flatnonzero(ended)
            if done.size:
                again = done[finished[done]]  # ended a second (third, ...) episode in this chunk
                if again.size:
                    later.extend(self._later_episodes(again, j, step_reason))
                first = done[~finished[done]]
                reason[first] = step_reason[first]  # the reason of the episode info["episode"] reports
                self._finish(first, episode, final_obs, final_success, finished)
                self._live[done] = False
                in_chunk_episode[done] = False
            for observer in self._observers:  # before an immediate reset: they see each episode's last step
                observer({"obs": self._obs, "instruction": self._instructions,
                          "reward": rewards[:, j], "success": success[:, j], "valid": valid[:, j],
                          "stepped": stepped, "elapsed": self._elapsed, "done": ended})
            if done.size and self.auto_reset and self.chunk_reset == "immediate":
                self._reset_envs(done, np.full(done.size, -1, np.int64))

        if self.auto_reset and self.chunk_reset == "end_of_chunk":
            done = np.flatnonzero(finished)
            self._reset_envs(done, np.full(done.size, -1, np.int64))

        info: dict[str, Any] = {"success": success, **progress, "state_id": self._state_id.copy()}
        if truncated.any():
            info["truncation_reason"] = reason  # "time_limit" | "worker_crashed" ("" elsewhere)
        if finished.any():
            info["episode"] = episode
            info["_episode"] = finished.copy()
            info["episode_state_id"] = self._finished_state_id.copy()  # initial state of each finished episode
            if self.auto_reset:
                final_obs["instruction"] = tuple(final_obs["instruction"])
                info["final_obs"] = final_obs
                info["_final_obs"] = finished.copy()
                info["final_info"] = {"success": final_success, "_success": finished.copy(),
                                      "episode": episode, "_episode": finished.copy()}
                info["_final_info"] = finished.copy()
        if later:
            info["later_episodes"] = later
        return ChunkStepResult(self._current_obs(), rewards, terminated, truncated, valid, info)

    def _finish(self, done: np.ndarray, episode: dict[str, np.ndarray], final_obs: dict[str, Any],
                final_success: np.ndarray, finished: np.ndarray) -> None:
        """Record metrics and the final observation of episodes ending now."""
        episode["success_once"][done] = self._success_once[done]
        for name, once in self._progress_once.items():
            episode[f"{name}_once"][done] = once[done]
        for name, count in self._counts.items():
            episode[name][done] = count[done]
        episode["success_at_end"][done] = self._last_success[done]
        episode["return"][done] = self._return[done]
        episode["length"][done] = self._elapsed[done]
        self._finished_state_id[done] = self._state_id[done]
        final_success[done] = self._last_success[done]
        for key in self._array_keys:
            final_obs[key][done] = self._obs[key][done]
        for i in done:
            final_obs["instruction"][i] = self._instructions[i]
        finished[done] = True

    def _later_episodes(self, done: np.ndarray, sub_step: int, reason: np.ndarray) -> list[dict[str, Any]]:
        """One record per env in ``done`` whose episode ends at ``sub_step`` although the env
        already finished an episode earlier in this chunk (``chunk_reset="immediate"`` without
        skipping: the new episode ran on the chunk's leftover, invalid sub-steps)."""
        records = []
        for i in done:
            metrics = {"success_once": bool(self._success_once[i]), "success_at_end": bool(self._last_success[i]),
                       "return": float(self._return[i]), "length": int(self._elapsed[i])}
            metrics |= {f"{name}_once": bool(once[i]) for name, once in self._progress_once.items()}
            metrics |= {name: int(count[i]) for name, count in self._counts.items()}
            final = {key: self._obs[key][i].copy() for key in self._array_keys}
            final["instruction"] = self._instructions[i]
            records.append({"env": int(i), "sub_step": int(sub_step), "episode": metrics,
                            "episode_state_id": int(self._state_id[i]), "final_obs": final,
                            "truncation_reason": str(reason[i])})
        return records

    def _check_actions(self, actions: Any, chunked: bool) -> np.ndarray:
        if hasattr(actions, "detach"):  # torch.Tensor, without importing torch here
            actions = actions.detach().cpu().numpy()
        actions = np.asarray(actions)
        a = self.single_action_space.shape[0]
        want = f"({self.num_envs}, C, {a})" if chunked else f"({self.num_envs}, {a})"
        if actions.dtype.kind not in "fiu":
            raise TypeError(f"actions must be a real-valued array {want}, got dtype {actions.dtype}")
        ndim = 3 if chunked else 2
        if (actions.ndim != ndim or actions.shape[0] != self.num_envs or actions.shape[-1] != a
                or (chunked and actions.shape[1] < 1)):
            raise ValueError(f"actions must have shape {want}, got {actions.shape}")
        actions = actions.astype(np.float32, copy=False)
        finite = np.isfinite(actions).reshape(self.num_envs, -1).all(axis=1)
        if not finite.all():
            raise ValueError(f"actions contain NaN or inf for env(s) {np.flatnonzero(~finite).tolist()}")
        low, high = self.single_action_space.low, self.single_action_space.high
        outside = ((actions < low) | (actions > high)).reshape(self.num_envs, -1).any(axis=1)
        if outside.any():
            if self.action_out_of_range == "raise":
                raise ValueError(
                    f"actions outside [{low.min()}, {high.max()}] for env(s) "
                    f"{np.flatnonzero(outside).tolist()}; pass action_out_of_range='clip' to clip"
                )
            actions = np.clip(actions, low, high)
        return actions

    # ------------------------------------------------------------------ misc
    def _current_obs(self) -> dict[str, Any]:
        obs: dict[str, Any] = {k: v.copy() for k, v in self._obs.items()}
        obs["instruction"] = tuple(self._instructions)
        return obs

    @property
    def elapsed_steps(self) -> np.ndarray:
        """Steps each env's running episode has taken, int ``[N]`` (a copy)."""
        return self._elapsed.copy()

    def add_step_observer(self, observer: Callable[[dict[str, Any]], None]) -> None:
        """Call ``observer`` after every sub-step with a dict of the current ``obs``,
        ``instruction``, and per-env ``reward``, ``success``, ``valid``, ``stepped`` (the env's
        running episode took this sub-step's action: also an episode that began within the chunk
        when finished envs are not skipped), ``elapsed`` (steps of the running episode) and
        ``done`` (its episode ended at this sub-step). An env whose episode
        ended is seen before it is reset, whatever ``chunk_reset``: ``obs`` is then the episode's
        last observation. The video recorder uses this to see every sub-step of a chunk. Observers
        must not modify the arrays."""
        self._observers.append(observer)

    def expert_state(self) -> dict[str, np.ndarray]:
        """The task's privileged state of every env now, each field ``[N, ...]`` (world poses of
        the TCP, object and plate, whether the object is held, ...): what scripted experts and
        diagnostics read; never part of an observation. One batched call on every backend.

        Raises:
            NotImplementedError: the task (or the real robot) has no privileged state.
        """
        self._check_open()
        return self.backend.expert_state()

    @property
    def exhausted(self) -> bool:
        """``enumerate_initial_states``: every initial state has run and no episode is running."""
        return (self.enumerate_initial_states and self._next_state_id >= len(self._enumeration)
                and not self._live.any())

    @property
    def instructions(self) -> tuple[str, ...]:
        """The instruction of each env's current episode."""
        return tuple(self._instructions)

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedEnvError("this env is closed; make a new one")

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.closed = True
            self.backend.close()
