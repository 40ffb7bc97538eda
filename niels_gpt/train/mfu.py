"""Model FLOPs utilisation: FLOPs per token x tokens/s / (peak FLOP/s x ranks), in percent.

The peak is dense bf16 from the table below (matched on the CUDA device's name) or `--peak-tflops`;
where neither knows the device, MFU is left out.
"""

from __future__ import annotations

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
