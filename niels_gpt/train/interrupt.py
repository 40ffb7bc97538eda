"""Ctrl-C (SIGINT) and SIGTERM during training: finish the step, save it, say how to resume (exit 130).

A second Ctrl-C interrupts at once. Under DDP the ranks agree on the step (an all-reduce per step).
Handlers go in only in the main thread, never over an ignored signal (nohup), and are restored after.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from dataclasses import MISSING, fields

import torch
import torch.distributed as dist

from niels_gpt.train.config import flag_of

# flags whose value never belongs on the resume command line: resuming replaces them
NOT_REPEATED = ("resume", "init_from", "overwrite")


class StopRequests:
    """`with StopRequests() as stop:` ... `stop.requested(device)` at the end of each step."""

    def __init__(self):
        self.signal: str | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored on purpose (nohup, a shell's background job): left ignored
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        self.signal = signal.Signals(signum).name

    def requested(self, device: torch.device) -> bool:
        """Whether any rank was asked to stop (every rank gets the same answer)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.signal is not None
        flag = torch.tensor([1.0 if self.signal else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.signal is None:
            self.signal = "SIGINT"  # another rank's signal: torchrun forwards one to every rank anyway
        return bool(flag.item())


def resume_command(cfg, checkpoint: str, world: int) -> str:
    """The command line that continues this run from `checkpoint`: every flag that differs from its
    default, --resume CHECKPOINT, under torchrun when the run had several ranks."""
    args = ["train", cfg.data]
    for f in fields(cfg):
        if f.name == "data" or f.name in NOT_REPEATED:
            continue
        value, default = getattr(cfg, f.name), (None if f.default is MISSING else f.default)
        if value == default:
            continue
        flag = flag_of(f.name)
        args += [flag if value else "--no-" + f.name.replace("_", "-")] if isinstance(value, bool) else [flag, str(value)]
    args += ["--resume", checkpoint]
    launcher = ["torchrun", f"--nproc_per_node={world}", "-m", "niels_gpt.cli"] if world > 1 else \
        [sys.executable, "-m", "niels_gpt.cli"]
    return shlex.join(launcher + args)
