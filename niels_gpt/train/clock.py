"""The step log's figures: elapsed time, time left at the pace so far, passes over the data (`epoch 1.25`), and
model FLOPs utilisation: FLOPs per token x tokens/s / (peak FLOP/s x ranks), in percent.

The peak is dense bf16 from the table below (matched on the CUDA device's name) or `--peak-tflops`;
where neither knows the device, MFU is left out.
"""

from __future__ import annotations

import time

import torch

# dense bf16 tensor-core TFLOP/s from the vendors' data sheets; more specific names first
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10", 125.0),
)


def duration(seconds: float) -> str:
    """`45s`, `3m07s`, `2h05m`: whole seconds, minutes from one minute on, hours from one hour on."""
    s = max(int(round(seconds)), 0)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class RunClock:
    """Started before the first step this process runs (`first`); the run ends after step `last`."""

    def __init__(self, first: int, last: int, clock=time.perf_counter):
        self.first, self.last, self.clock = first, last, clock
        self.t0 = clock()

    def fields(self, done: int, epoch: float | None = None) -> str:
        """` | elapsed .. | eta .. | epoch ..` after `done` steps (counted from the run's start)."""
        elapsed = self.clock() - self.t0
        ran = done - self.first
        eta = elapsed / ran * (self.last - done) if ran > 0 else 0.0
        return (f" | elapsed {duration(elapsed)} | eta {duration(eta)}"
                + ("" if epoch is None else f" | epoch {epoch:.2f}"))


def peak_tflops(device: torch.device, given: float | None = None) -> float | None:
    """Peak TFLOP/s of one device: `given`, else the table's entry for this CUDA device, else None."""
    if given is not None:
        return float(given)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS if key in name), None)


def mfu(flops_per_token: int, tokens_per_s: float, peak: float | None, world: int = 1) -> float | None:
    """MFU in percent, or None where the peak is unknown."""
    if peak is None or peak <= 0:
        return None
    return 100.0 * flops_per_token * tokens_per_s / (peak * 1e12 * world)
