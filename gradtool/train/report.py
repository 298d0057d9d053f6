"""What a training run reports: the result, the progress callbacks, the loss plot."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from .options import TrainError


@dataclass
class TrainResult:
    steps: int = 0                    # steps taken in this run
    epochs: int = 0                   # epochs completed in this run
    final_loss: Optional[float] = None
    train_loss: Optional[float] = None
    val_loss: Optional[float] = None
    accuracy: Optional[float] = None  # validation accuracy, or training accuracy without validation
    accuracy_on: Optional[str] = None  # "val" or "train"
    seconds: float = 0.0
    stopped: str = "done"             # done | steps | interrupted | nonfinite
    bad_loss: Optional[float] = None
    position: dict = field(default_factory=dict)
    saved: Optional[str] = None
    save_skipped: bool = False        # nonfinite parameters were not written over the file
    step_losses: list = field(default_factory=list)   # (global_step, loss), kept for --plot
    val_losses: list = field(default_factory=list)    # (global_step, val loss)
    optimizer_state_bytes: Optional[list] = None      # per rank (one entry: one process)

    def summary(self) -> dict:
        out = {"steps": self.steps, "epochs": self.epochs, "final_loss": self.final_loss,
               "train_loss": self.train_loss, "val_loss": self.val_loss}
        if self.accuracy_on:
            out[f"{self.accuracy_on}_accuracy"] = self.accuracy
        out.update({"seconds": round(self.seconds, 6), "stopped": self.stopped,
                    "epoch": self.position.get("epoch"),
                    "global_step": self.position.get("global_step"), "saved": self.saved})
        return out


class Reporter:
    """Receives progress.  Every method is optional; the CLI's console reporter and the
    JSONL log implement them."""

    def note(self, text: str) -> None: ...
    def step(self, record: dict) -> None: ...
    def epoch(self, record: dict) -> None: ...
    def end(self, result: TrainResult) -> None: ...


def require_plotting() -> None:
    """Fail early, before any training, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TrainError("--plot needs matplotlib, an optional extra: "
                         "pip install 'gradtool[plot]'") from None


def plot_losses(path, result: TrainResult) -> None:
    """The per-step training loss and the per-epoch validation loss, as an image (atomic)."""
    require_plotting()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..fileio import atomic_write_with

    fig, ax = plt.subplots(figsize=(7, 4))
    if result.step_losses:
        steps, losses = zip(*result.step_losses)
        ax.plot(steps, losses, lw=0.8, label="training loss (per step)")
    if result.val_losses:
        steps, losses = zip(*result.val_losses)
        ax.plot(steps, losses, "o-", label="validation loss (per epoch)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log" if all(v > 0 for _, v in result.step_losses + result.val_losses)
                  and (result.step_losses or result.val_losses) else "linear")
    ax.legend()
    fig.tight_layout()
    fmt = os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png"
    try:
        atomic_write_with(path, lambda f: fig.savefig(f, format=fmt))
    finally:
        plt.close(fig)
