"""A training run as trace reads it: its checkpoints' settings and loader states, by step.

Step N (1 = the first) was made by the segment that wrote the first checkpoint at or after N; the replay
starts at the checkpoint before it, or at step 0. Checkpoints are opened with mmap: weights are not read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from niels_gpt.errors import ConfigError
from niels_gpt.train.checkpoint import CKPT_PATTERN, RUN_NAME, checkpoints, read_run
from niels_gpt.urls import is_url


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    config: dict  # the train_config the segment that wrote it ran with
    states: list  # one loader state per rank ({"kind", "loader"})
    vocab_size: int | None

    @property
    def world_size(self) -> int:
        return len(self.states)

    @property
    def accum(self) -> int:
        """Micro-batches per rank per step."""
        if self.config.get("batch_ramp"):
            return 1
        tokens = int(self.config["device_batch_size"]) * int(self.config["sequence_len"]) * self.world_size
        return int(self.config.get("total_batch_size") or tokens) // tokens


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime: float) -> Checkpoint:
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        step, config, states = int(ckpt["step"]), dict(ckpt["train_config"]), list(ckpt["loader"])
    except Exception as exc:  # noqa: BLE001 - a damaged zip or pickle raises many kinds; each is this one condition
        raise ConfigError(f"{path}: not a readable checkpoint of this trainer ({type(exc).__name__}); "
                          "trace reads the run's checkpoints: move the damaged file out of the run directory") from None
    vocab = (ckpt.get("model_config") or {}).get("vocab_size")
    return Checkpoint(step, Path(path), config, states, vocab)


class Run:
    """`Run(dir)`: the run's checkpoints; `segment(step)` -> (the checkpoint whose segment made the step,
    the checkpoint the replay starts from or None for step 0)."""

    def __init__(self, run_dir, *, data: str | None = None):
        self.dir = Path(run_dir)
        if not self.dir.is_dir():
            what = "a file" if self.dir.exists() else "no such directory"
            raise ConfigError(f"{self.dir}: {what}; give a run directory (the --out-dir of `train`, holding "
                              f"{RUN_NAME} and ckpt_<step>.pt files)")
        paths = checkpoints(self.dir)
        if read_run(self.dir) is None or not paths:
            raise ConfigError(f"{self.dir}: not a training run ({'no ' + RUN_NAME if read_run(self.dir) is None else 'no checkpoint'}); "
                              "give the --out-dir of a `train` run that saved a checkpoint")
        self.paths = paths
        self.steps = [int(CKPT_PATTERN.match(p.name).group(1)) for p in paths]
        self.data_override = data

    def checkpoint(self, i: int) -> Checkpoint:
        p = self.paths[i]
        return _load(str(p), p.stat().st_mtime)

    def segment(self, step: int) -> tuple[Checkpoint, Checkpoint | None]:
        last = self.steps[-1]
        if not 1 <= step <= last:
            raise ConfigError(f"--step {step}: beyond the run {self.dir}, whose checkpoints reach step {last} "
                              f"({self.paths[-1].name}); give a step from 1 to {last}")
        after = next(i for i, s in enumerate(self.steps) if s >= step)
        return self.checkpoint(after), (self.checkpoint(after - 1) if after else None)

    def segments(self) -> list[tuple[int, int, Checkpoint, Checkpoint | None]]:
        """[(first step, last step, checkpoint that made them, start checkpoint or None)] covering the run."""
        out, prev = [], 0
        for i, s in enumerate(self.steps):
            if s > prev:
                out.append((prev + 1, s, self.checkpoint(i), self.checkpoint(i - 1) if i else None))
            prev = s
        return out

    def data(self, config: dict) -> str:
        """The run's data as a path that exists from here (as recorded, else beside the run), or its URL."""
        recorded = self.data_override or str(config["data"])
        if is_url(recorded) or Path(recorded).exists() or self.data_override:
            return recorded
        for base in self.dir.resolve().parents:
            if (base / recorded).exists():
                return str(base / recorded)
        return recorded
