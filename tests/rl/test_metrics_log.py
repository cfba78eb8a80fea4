"""The metric logger's backends: metrics.jsonl, TensorBoard, and W&B without an account (offline,
no login prompt)."""

from __future__ import annotations

import pytest

from vla_trainer.metrics_log import MetricLogger, read_metrics


def test_wandb_without_api_key_logs_offline_instead_of_prompting(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: not logged in
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.warns(UserWarning, match="no W&B API key.*offline"):
        log = MetricLogger(tmp_path / "run", ["tensorboard", "wandb"], "exp", {"actor": {"seed": 1}})
    log.log({"iteration": 1, "env_steps": 8, "actor/policy_loss": 0.5, "eval/success_once": float("nan")})
    log.close()
    assert read_metrics(tmp_path / "run")[0]["actor/policy_loss"] == 0.5
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
