"""RolloutBuffer: the one storage both runtimes fill (whole batches in one process, worker slices on Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_trainer.rl.rollout import RolloutBuffer

T, N, C, A = 3, 5, 2, 7


def chunk(t: int, rows: np.ndarray, with_state: bool = True) -> dict:
    """Chunk ``t`` of envs ``rows``: every value encodes (t, env) so that a misplaced write shows."""
    code = (10 * t + rows).astype(np.float32)
    n = len(rows)
    return dict(
        instruction=[f"task {t}.{i}" for i in rows],
        episodes={"success_once": code.tolist()},
        image=np.broadcast_to(code.astype(np.uint8)[:, None, None, None], (n, 4, 4, 3)).copy(),
        state=np.repeat(code[:, None], 9, axis=1) if with_state else None,
        action_token_ids=torch.as_tensor(code, dtype=torch.long)[:, None, None].expand(n, C, A).clone(),
        log_probs=-torch.as_tensor(code)[:, None, None].expand(n, C, A).clone(),
        values=torch.as_tensor(code)[:, None].expand(n, C).clone(),
        final_values=torch.as_tensor(code) / 2,
        rewards=torch.as_tensor(code)[:, None].expand(n, C).clone(),
        terminated=torch.as_tensor(code % 2 == 0)[:, None].expand(n, C).clone(),
        truncated=torch.zeros(n, C, dtype=torch.bool),
        valid=torch.ones(n, C, dtype=torch.bool),
    )


def test_worker_slices_fill_the_same_rollout_as_whole_batches():
    whole, sliced = RolloutBuffer(T, N), RolloutBuffer(T, N)
    for t in range(T):
        whole.write(t, slice(None), **chunk(t, np.arange(N)))
        for rows in (slice(0, 2), slice(2, 5)):  # two env workers
            sliced.write(t, rows, **chunk(t, np.arange(N)[rows]))
    a = whole.rollout(torch.zeros(N), {"generation": 1.0})
    b = sliced.rollout(torch.zeros(N), {"generation": 1.0})
    assert a.image.shape == (T, N, 4, 4, 3) and a.image.dtype == np.uint8
    assert a.action_token_ids.shape == (T, N, C, A) and a.action_token_ids.dtype == torch.long
    assert a.state.shape == (T, N, 9) and a.terminated.dtype == torch.bool
    for name in ("image", "state"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for name in RolloutBuffer.TORCH_FIELDS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.instruction == b.instruction and a.instruction[2][4] == "task 2.4"
    assert a.image[1, 3, 0, 0, 0] == 13 and a.log_probs[2, 1, 0, 0] == -21  # each write where it belongs
    assert sorted(a.episodes["success_once"]) == sorted(b.episodes["success_once"])
    assert len(a.episodes["success_once"]) == T * N


def test_a_field_one_write_lacks_is_absent_from_the_rollout():
    buffer = RolloutBuffer(T, N)
    for t in range(T):
        buffer.write(t, slice(0, 2), **chunk(t, np.arange(2)))
        buffer.write(t, slice(2, 5), **chunk(t, np.arange(2, 5), with_state=False))
    assert buffer.rollout(torch.zeros(N), {}).state is None
    with pytest.raises(KeyError, match="no field 'obs'"):
        buffer.write(0, slice(None), instruction=[""] * N, obs=np.zeros(N))
