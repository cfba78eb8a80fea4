"""Where training metrics go: ``metrics.jsonl`` (always), TensorBoard, Weights & Biases, a plot.

One record per iteration: ``{"iteration": i, "env_steps": s, "time/...": seconds, "train/...",
"eval/...", "actor/...", "critic/..."}``. The JSON lines file is what ``success_curve`` plots and
what tests read; TensorBoard gets the same scalars under the same names.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import warnings
from pathlib import Path


class MetricLogger:
    """Writes one record per iteration to every backend.

    Args:
        purge_after_step: TensorBoard drops what earlier writers logged at steps (env steps) after
            this one: the iterations a resumed run does again (-1: a new run, all of it). A resumed
            run logs to the same W&B run as before, which keeps the values it already has for those
            iterations (W&B ignores a step below its last one).
    """

    def __init__(self, run_dir: Path, backends: list[str], experiment_name: str, config: dict | None = None,
                 purge_after_step: int = -1):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.run_dir / "metrics.jsonl"
        self.tb = None
        self.wandb = None
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge_after_step + 1)
        if "wandb" in backends:
            try:
                import wandb
            except ImportError:
                warnings.warn("runner.logger.logger_backends has 'wandb' but wandb is not installed "
                              "(pip install wandb); logging to the other backends only", stacklevel=2)
            else:
                mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_logged_in() else "offline")
                if mode == "offline" and "WANDB_MODE" not in os.environ:
                    warnings.warn(f"no W&B API key (WANDB_API_KEY or `wandb login`): logging offline under "
                                  f"{self.run_dir / 'wandb'}; `wandb sync` uploads it later", stacklevel=2)
                self.wandb = wandb.init(project="vla-rl", name=experiment_name, dir=str(self.run_dir),
                                        id=_wandb_run_id(self.run_dir, resumed=purge_after_step >= 0),
                                        config=config, resume="allow", mode=mode)

    def log(self, record: dict) -> None:
        with self.jsonl.open("a") as f:
            f.write(json.dumps(record) + "\n")
        step = record.get("env_steps", record.get("iteration", 0))
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_run_id(run_dir: Path, resumed: bool) -> str:
    """The W&B run a run folder logs to, kept in ``wandb/run_id``: a resumed run continues the run its
    folder logged to before; a new run starts another."""
    path = run_dir / "wandb" / "run_id"
    if resumed and path.is_file() and (run_id := path.read_text().strip()):
        return run_id
    path.parent.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)  # W&B's own ids are 8 characters of [a-z0-9] too
    path.write_text(run_id + "\n")
    return run_id


def _wandb_logged_in() -> bool:
    """Whether W&B has an API key, without its interactive login prompt."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``metrics.jsonl``. A last line that does not parse (a write cut by a crash or a
    full disk) is left out with a warning; a bad line before the last is an error naming it."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number < len(lines):
                raise ValueError(f"{path}: line {number} is not a JSON record ({e}); remove it to go on") from None
            warnings.warn(f"{path}: its last line is cut off (a write interrupted); left out", stacklevel=2)
    return records


def success_curve(records: list[dict], out_png: str | Path, title: str = "") -> Path | None:
    """Plots eval success_once / success_at_end (and grasped_once where the task reports it, and
    train success_once) against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = [r for r in records if "eval/success_once" in r]
    if not evals:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    x = [r["env_steps"] for r in evals]
    ax.plot(x, [100 * r["eval/success_once"] for r in evals], "o-", label="eval success_once")
    ax.plot(x, [100 * r["eval/success_at_end"] for r in evals], "s--", label="eval success_at_end")
    if all("eval/grasped_once" in r for r in evals):
        ax.plot(x, [100 * r["eval/grasped_once"] for r in evals], "^:", label="eval grasped_once (partial)")
    train = [r for r in records if "train/success_once" in r]
    if train:
        ax.plot([r["env_steps"] for r in train], [100 * r["train/success_once"] for r in train], ".",
                alpha=0.4, label="train success_once (sampled episodes)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("success (%)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def sft_curve(curve: list[dict], out_png: str | Path) -> Path | None:
    """Plots a ``train_sft`` curve: greedy action L1 against the zero-action baseline, and the NLL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not curve:
        return None
    steps = [p["step"] for p in curve]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(steps, [p["action_l1"] for p in curve], "o-", label="greedy action L1")
    ax.plot(steps, [p["action_l1_of_zero"] for p in curve], "--", color="gray", label="L1 of the zero action")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("mean |action error| per dimension")
    ax.grid(alpha=0.3)
    nll = ax.twinx()
    nll.plot(steps, [p["loss"] for p in curve], "s:", color="tab:red", label="NLL per token")
    nll.set_ylabel("NLL per token (nats)", color="tab:red")
    lines = ax.get_legend_handles_labels()
    more = nll.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="best", fontsize=8)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png)
    plt.close(fig)
    return out_png
