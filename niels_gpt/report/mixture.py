"""The realised proportions of a mixture config, step by step, as MixtureSampler draws them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from niels_gpt.errors import ConfigError
from niels_gpt.loading.mixture import MixtureConfig, check_phases, quota_step
from niels_gpt.report.figures import Stats, StreamStats


def mixture_stats(path: str | Path, *, steps: int = 1000, global_batch_size: int = 64) -> Stats:
    """Realised proportions of a mixture config over `steps` steps of `global_batch_size` samples.

    The per-step counts are those MixtureSampler draws (the same quota rule, phases and temperature);
    the datasets themselves are not opened."""
    for name, v in (("--steps", steps), ("--batch", global_batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{path}: {name} must be a positive integer, got {v!r}")
    cfg = MixtureConfig.from_file(path)
    names = list(cfg.datasets)
    try:  # the sampler's checks: a first phase after step 0 left no weights for the first steps
        phases = check_phases(list(cfg.phases), names, cfg.temperature)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    counts = np.zeros((steps, len(names)), dtype=np.int64)
    carry = [0.0] * len(names)
    for step in range(steps):
        probs = [p for start, p in phases if start <= step][-1]
        counts[step], carry = quota_step(probs, carry, global_batch_size)
    cum = np.cumsum(counts, axis=0)
    realised = cum / cum.sum(axis=1, keepdims=True)
    final = [p for start, p in phases if start <= steps - 1][-1]
    streams = [StreamStats(name=n, tokens=int(cum[-1, i]), documents=None, eot=None, bos=None)
               for i, n in enumerate(names)]
    extra = {"steps": steps, "global_batch_size": global_batch_size, "names": names,
             "target": {n: final[i] for i, n in enumerate(names)},
             "realised": {n: float(realised[-1, i]) for i, n in enumerate(names)},
             "realised_over_steps": realised.tolist(), "phases": [[s, p] for s, p in phases]}
    return Stats(str(path), "mixture", streams, extra)

