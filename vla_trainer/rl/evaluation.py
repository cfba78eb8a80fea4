"""Evaluating a policy: every env runs exactly one episode per round, metrics averaged.

``evaluate_policy`` resets all envs with a round's seed, steps chunks until every env's episode
has ended (the eval env has ``auto_reset=False``, so a finished env idles and is never counted
twice), and repeats for ``num_episodes / num_envs`` rounds. The same seed and number of envs
give the same initial states, so evaluations along a run (and across runs) compare like with like.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import torch


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate (95 % at z = 1.96): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or n successes, which is where
    small evaluations of robot policies usually are (0 of 32 still allows about 11 %)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"successes={successes}, trials={trials}: need 0 <= successes <= trials, trials >= 1")
    p, z2 = successes / trials, z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * np.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def round_seed(seed: int, round_index: int) -> int:
    """The reset seed of evaluation round ``round_index``; never one of training's seeds (the
    initial states it draws come from the same set as training's unless the eval env is a held-out
    twin)."""
    return int(np.random.SeedSequence([seed, 1_000_003, round_index]).generate_state(1)[0])


def executed_actions(actions: torch.Tensor, execute_steps: int | None) -> np.ndarray:
    """The part of each predicted chunk that is executed before the policy re-plans: the first
    ``execute_steps`` actions (LeRobot's ``n_action_steps``), or all of them.

    Shapes:
        actions: ``[N, C, 7]``. Returns ``[N, execute_steps or C, 7]``.

    Raises:
        ValueError: ``execute_steps`` outside ``1 .. C``.
    """
    check_execute_steps(execute_steps, actions.shape[1])
    return actions[:, :execute_steps].cpu().numpy()


def check_execute_steps(execute_steps: int | None, chunk_size: int) -> None:
    """Raise a ValueError unless ``execute_steps`` is None or an integer in ``1 .. chunk_size``."""
    if execute_steps is None:
        return
    if isinstance(execute_steps, bool) or not isinstance(execute_steps, int) or not 1 <= execute_steps <= chunk_size:
        raise ValueError(f"execute_steps={execute_steps!r}: must be an integer from 1 to the policy's chunk "
                         f"({chunk_size})")


@torch.no_grad()
def evaluate_policy(env, policy, num_episodes: int, *, seed: int = 0, greedy: bool = False,
                    temperature: float = 0.6, top_k: int | None = None, execute_steps: int | None = None,
                    progress=None, episodes: dict | None = None) -> dict:
    """Mean ``success_once``, ``success_at_end``, ``return``, ``length`` over ``num_episodes``,
    and ``<flag>_once`` for each of the task's progress flags (``grasped_once``: partial success).
    ``execute_steps``: re-plan after this many actions of each chunk (default: the whole chunk).
    ``episodes``: if given, filled with each episode's ``state_id`` and ``success_once`` (lists in
    the order episodes ended), so two evaluations can be checked to have run the same states.
    An episode cut by its simulator's crash (``truncation_reason`` ``worker_crashed``) is no
    failure of the policy: it is left out, and ``crashed_episodes`` counts it.

    Raises:
        ValueError: ``num_episodes`` is not a positive multiple of ``env.num_envs``, the env
            resets finished episodes itself (``auto_reset=True``), or ``execute_steps`` is not in
            ``1 .. chunk``.
    """
    n = env.num_envs
    base = getattr(env, "unwrapped", env)  # wrappers (RecordVideo) do not forward the contract's attributes
    if num_episodes < 1 or num_episodes % n:
        raise ValueError(f"num_episodes={num_episodes} must be a positive multiple of num_envs={n}")
    if getattr(base, "auto_reset", False):
        raise ValueError("evaluation needs an env made with auto_reset=False (each episode counted once)")
    per_episode: dict[str, list[float]] = defaultdict(list)
    crashed = 0
    generator = torch.Generator().manual_seed(seed)
    max_chunks = base.max_episode_steps // (execute_steps or policy.chunk_size) + 2
    for r in range(num_episodes // n):
        obs, _ = env.reset(seed=round_seed(seed, r))
        finished = np.zeros(n, bool)
        for _ in range(max_chunks):
            sample = policy.act(obs, temperature=temperature, top_k=top_k, greedy=greedy, generator=generator)
            out = env.chunk_step(executed_actions(sample.actions, execute_steps))
            if "episode" in out.info:
                ended = out.info["_episode"] & ~finished
                done = ended & ~crashed_now(out.info)
                crashed += int((ended & ~done).sum())
                for key, values in out.info["episode"].items():
                    per_episode[key].extend(np.asarray(values)[done].astype(float).tolist())
                if episodes is not None:
                    episodes.setdefault("state_id", []).extend(out.info["episode_state_id"][done].tolist())
                    episodes.setdefault("success_once", []).extend(
                        out.info["episode"]["success_once"][done].astype(bool).tolist())
                finished |= ended
            obs = out.obs
            if finished.all():
                break
        if progress is not None:
            progress(r + 1, num_episodes // n)
    if not per_episode["success_once"]:
        raise RuntimeError(f"all {crashed} evaluation episodes ended by simulator crashes; nothing to report")
    return {key: float(np.mean(vals)) for key, vals in per_episode.items()} | {
        "num_episodes": len(per_episode["success_once"])} | ({"crashed_episodes": crashed} if crashed else {})


def crashed_now(info: dict) -> np.ndarray:
    """Per env: its episode was cut by its simulator's crash in this chunk (not the policy's doing)."""
    reason = info.get("truncation_reason")
    n = len(info["state_id"])
    return np.zeros(n, bool) if reason is None else np.asarray(reason, dtype=object) == "worker_crashed"


def evaluate_recipe(env, policy, cfg) -> dict:
    """``evaluate_policy`` with a training recipe's evaluation settings (``env.eval.num_episodes``,
    ``actor.seed``, ``algorithm.sampling_params``)."""
    sp = cfg.algorithm.sampling_params
    return evaluate_policy(env, policy, cfg.env.eval.num_episodes, seed=cfg.actor.seed, greedy=sp.use_greedy,
                           temperature=sp.temperature_eval, top_k=sp.top_k or None)


@torch.no_grad()
def evaluate_initial_states(env, policy, *, seed: int = 0, greedy: bool = False, temperature: float = 0.6,
                            top_k: int | None = None, execute_steps: int | None = None,
                            progress=None) -> dict[int, dict]:
    """Runs every initial state the env enumerates exactly once (an env made with
    ``enumerate_initial_states`` and ``auto_reset=True``, so finished envs move on to the next
    state at once). Returns ``{state_id: {success_once, success_at_end, return, length, ...}}``
    (the env's ``episode_metrics``), each with ``crashed``: its simulator crashed (no failure of the
    policy's; leave it out of success rates)."""
    base = getattr(env, "unwrapped", env)
    if not (getattr(base, "enumerate_initial_states", False) and getattr(base, "auto_reset", False)):
        raise ValueError("evaluate_initial_states needs an env made with enumerate_initial_states and auto_reset=True")
    generator = torch.Generator().manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    results: dict[int, dict] = {}
    while not base.exhausted:
        sample = policy.act(obs, temperature=temperature, top_k=top_k, greedy=greedy, generator=generator)
        out = env.chunk_step(executed_actions(sample.actions, execute_steps))
        if "episode" in out.info:
            crashed = crashed_now(out.info)
            for i in np.flatnonzero(out.info["_episode"]):
                results[int(out.info["episode_state_id"][i])] = {
                    **{k: float(v[i]) for k, v in out.info["episode"].items()}, "crashed": bool(crashed[i])}
            if progress is not None:
                progress(len(results))
        obs = out.obs
    return results


COMPARED = ("success_once", "success_at_end", "grasped_once", "return")


def compare_to_baseline(baseline: dict, row: dict, names: tuple[str, str] = ("baseline", "policy")) -> list[str]:
    """Lines comparing one task's evaluation ``row`` with a ``baseline`` row of the same task
    (both as ``vla-eval`` writes them to ``eval.json``): each metric both rows hold, its change,
    for ``success_once`` the 95 % intervals and a two-sided Fisher exact test of the counts
    (are the two success rates the same?), where both ran the same initial states the paired test
    of the states one succeeded on and the other not (``paired_success_test``), whether both ran
    the same initial states (from
    the rows' ``episodes``; an evaluation's states depend on its seed and its number of envs), and
    whether with the same settings (``SETTINGS``).

    Raises:
        ValueError: the rows are of different tasks.
    """
    from scipy.stats import fisher_exact

    if baseline.get("env_id") != row.get("env_id"):
        raise ValueError(f"the baseline is an evaluation of {baseline.get('env_id')!r}, this one of "
                         f"{row.get('env_id')!r}: compare evaluations of one task")
    lines = []
    for key in COMPARED:
        if key in baseline and key in row:
            scale, unit = (1, "") if key == "return" else (100, " %")
            a, b = scale * baseline[key], scale * row[key]
            lines.append(f"{key:15s} {names[0]} {a:6.2f}{unit}  ->  {names[1]} {b:6.2f}{unit}  ({b - a:+.2f})")
    n_a, n_b = baseline["num_episodes"], row["num_episodes"]
    k_a, k_b = round(baseline["success_once"] * n_a), round(row["success_once"] * n_b)
    p = fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]])[1]
    ci = {name: "-".join(f"{100 * x:.1f}" for x in wilson_interval(k, n)) for name, k, n in
          ((names[0], k_a, n_a), (names[1], k_b, n_b))}
    lines.append(f"success_once: {k_a} of {n_a} -> {k_b} of {n_b} episodes (95 % intervals {ci[names[0]]} % and "
                 f"{ci[names[1]]} %; Fisher's exact test, two-sided: p = {p:.3f})")
    paired = paired_success_test(baseline.get("episodes"), row.get("episodes"))
    if paired is not None:
        lost, gained, p_paired = paired
        lines.append(f"success_once, state by state: {gained} initial states won, {lost} lost (exact McNemar test of "
                     f"those {gained + lost}, two-sided: p = {p_paired:.3f}; the paired test, for two evaluations of "
                     f"the same initial states)")
    lines.append(same_initial_states(baseline.get("episodes"), row.get("episodes"), names))
    lines.append(same_settings(baseline, row, names))
    return lines


def paired_success_test(a: dict | None, b: dict | None) -> tuple[int, int, float] | None:
    """``(lost, gained, p)`` of two evaluations' ``episodes`` that ran the same initial states: the
    states ``a`` succeeded on and ``b`` did not, the reverse, and the two-sided exact McNemar test of
    them (a binomial test of ``gained`` among ``lost + gained`` at one half; the states both
    succeeded or both failed on carry no evidence of a change). None when the states differ or
    were not recorded with their outcomes. A state run more than once is paired run by run, in order.
    """
    from scipy.stats import binomtest

    if not a or not b or "success_once" not in a or "success_once" not in b:
        return None
    if sorted(a["state_id"]) != sorted(b["state_id"]):
        return None
    runs: dict[int, list] = {}
    for state, success in zip(a["state_id"], a["success_once"]):
        runs.setdefault(state, []).append(bool(success))
    lost = gained = 0
    for state, success in zip(b["state_id"], b["success_once"]):
        before = runs[state].pop(0)
        lost += before and not success
        gained += success and not before
    p = binomtest(gained, lost + gained, 0.5).pvalue if lost + gained else 1.0
    return int(lost), int(gained), float(p)


SETTINGS = ("env_kwargs", "asset_pack", "terminate", "max_episode_steps", "expert_start_phase")
"""What a ``vla-eval`` row records of how its episodes ran, besides the task and initial states."""


def same_settings(a: dict, b: dict, names: tuple[str, str] = ("baseline", "policy")) -> str:
    """One line saying whether two evaluation rows ran with the same env options, asset pack, episode
    end, step limit and start (``SETTINGS``): the same initial state ids under other options are other
    episodes."""
    for row, name in ((a, names[0]), (b, names[1])):
        if any(key not in row for key in SETTINGS):
            return f"settings: not recorded in the {name}'s eval.json, so not known to be the same"
    differ = [f"{key} {a[key]!r} vs {b[key]!r}" for key in SETTINGS if a[key] != b[key]]
    if not differ:
        return "settings: the same env options, asset pack, episode end, step limit and start in both"
    return f"settings: NOT the same ({'; '.join(differ)}): not a like-for-like comparison"


def same_initial_states(a: dict | None, b: dict | None, names: tuple[str, str] = ("baseline", "policy")) -> str:
    """One line saying whether two evaluations' ``episodes`` (``evaluate_policy``'s) ran the same
    initial states, each as often: then the comparison is like for like."""
    if not a or not b:
        missing = names[0] if not a else names[1]
        return f"initial states: not recorded in the {missing}'s eval.json, so not known to be the same"
    ids_a, ids_b = sorted(a["state_id"]), sorted(b["state_id"])
    if ids_a == ids_b:
        return f"initial states: the same {len(ids_a)} in both ({len(set(ids_a))} distinct)"
    shared = sum((Counter(ids_a) & Counter(ids_b)).values())
    return (f"initial states: NOT the same ({shared} of {len(ids_a)} / {len(ids_b)} shared; an evaluation's states "
            "follow its --seed and --num-envs): the two rates are still estimates of one task, not a like-for-like "
            "comparison")
