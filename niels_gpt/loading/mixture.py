"""Mixtures of map-style datasets: weights, temperature, a phase schedule, exact resumption.

- weights at step s: the last phase with start_step <= s; p_i = w_i^(1/temperature), normalised;
- dataset i gets floor(p_i*G + carry_i) of the G slots, the rest go to the largest remainders, the remainder
  is carried; the slots are shuffled from (seed, step) and rank r takes its contiguous share;
- within dataset i, draw k is perm_i,e[k mod N_i], e = k div N_i, perm from (seed, i, e);
- state {step, drawn, carry, seed, fingerprint, order} holds no weights: a state loads into a sampler with
  new weights and each dataset goes on from the draw where it stopped.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib
import torch

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading.order import EpochOrder, epoch_order, mix_seed
from niels_gpt.loading.schedule import BatchSchedule
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.resume import (
    ORDER_PEEK,
    STATE_VERSION,
    check_order_config,
    check_order_digest,
    check_state,
    dataset_fingerprint,
    fingerprint,
    order_record,
    resolve_rank,
    saved_order,
    state_floats,
    state_int,
    state_ints,
)
from niels_gpt.seeds import check_seed
from niels_gpt.urls import is_url

MIXTURE_KIND = "mixture_sampler"
MIXTURE_CODE = 1  # the draws' code version: bumped whenever the same settings give other draws
TEMPERATURE = 1.0
FILE_KEYS = ("datasets", "weights", "phases", "temperature", "seed", "split")  # what a mixture file may hold


@dataclass(frozen=True)
class Phase:
    """From `start_step` on, sample with `weights` (name -> weight, unnormalised)."""

    start_step: int
    weights: Mapping[str, float]


class MixtureDataset(torch.utils.data.Dataset):
    """`mix[(d, i)]` is `datasets[d][i]` tagged with `"dataset": d` (dict items) or appended (tuples)."""

    def __init__(self, datasets: Mapping[str, torch.utils.data.Dataset]):
        if not datasets:
            raise ConfigError("a mixture needs at least one dataset")
        self.names = list(datasets)
        self.datasets = [datasets[n] for n in self.names]
        for name, ds in zip(self.names, self.datasets, strict=True):
            if len(ds) == 0:
                raise ConfigError(f"mixture dataset {name!r} is empty; drop it or give it data")
        self._fingerprint = fingerprint("mixture", [[n, dataset_fingerprint(d)] for n, d in zip(self.names, self.datasets, strict=True)])

    def fingerprint(self) -> str:
        return self._fingerprint

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)

    def __getitem__(self, index):
        d, i = index
        item = self.datasets[d][i]
        if isinstance(item, dict):
            return {**item, "dataset": d}
        return (*item, d) if isinstance(item, tuple) else (item, d)


def normalised(weights: Sequence[float], temperature: float) -> list[float]:
    if temperature <= 0:
        raise ConfigError(f"temperature {temperature} must be > 0")
    if any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"mixture weights {list(weights)} must be finite, >= 0, not all 0")
    scaled = [w ** (1.0 / temperature) if w > 0 else 0.0 for w in weights]
    total = sum(scaled)
    return [s / total for s in scaled]


def quota_step(probs: Sequence[float], carry: Sequence[float], n: int) -> tuple[list[int], list[float]]:
    """Split n slots by probs plus carried remainders (largest remainder method).

    Worked example: probs [0.5, 0.3, 0.2], carry 0, n=4 -> quotas 2.0, 1.2, 0.8 -> floors [2, 1, 0],
    one slot left to the largest remainder (0.8) -> [2, 1, 1], carry [0, 0.2, -0.2].
    """
    quota = [p * n + c for p, c in zip(probs, carry, strict=True)]
    counts = [max(math.floor(q), 0) for q in quota]
    left = n - sum(counts)
    order = sorted(range(len(quota)), key=lambda i: (-(quota[i] - counts[i]), i))
    for i in order[:max(left, 0)]:
        counts[i] += 1
    while sum(counts) > n:  # only with negative carries after a phase change; take from the smallest
        i = min((i for i in range(len(counts)) if counts[i] > 0), key=lambda i: (quota[i] - counts[i], -i))
        counts[i] -= 1
    return counts, [q - c for q, c in zip(quota, counts, strict=True)]


def check_phases(phases: list[Phase], names: list[str], temperature: float) -> list[tuple[int, list[float]]]:
    """[(start step, probabilities over `names`)]; ConfigError for an unknown dataset or an order of starts
    that is not 0, then strictly increasing (the sampler's, and `stats` of a mixture file's)."""
    out = []
    for k, ph in enumerate(phases):
        unknown = sorted(set(ph.weights) - set(names))
        if unknown:
            raise ConfigError(f"phase {k} (start_step {ph.start_step}): unknown dataset(s) {unknown}; "
                              f"the mixture has {names}")
        out.append((int(ph.start_step), normalised([float(ph.weights.get(n, 0.0)) for n in names], temperature)))
    starts = [s for s, _ in out]
    if not out or starts[0] != 0 or starts != sorted(set(starts)):
        raise ConfigError(f"phase start steps {starts}: the first must be 0 and they must strictly increase")
    return out


class MixtureSampler:
    """Batch sampler over a MixtureDataset: infinite, yields this rank's [(d, i), ...] per step."""

    def __init__(self, mixture: MixtureDataset, global_batch_size: int, *, phases: Sequence[Phase] | None = None,
                 weights: Mapping[str, float] | None = None, temperature: float = TEMPERATURE, seed: int,
                 rank: int | None = None, world_size: int | None = None):
        self.rank, self.world_size = resolve_rank(rank, world_size)
        global_batch_size = BatchSchedule.of(global_batch_size, None, self.world_size, "MixtureSampler").steps[0][1]
        if (phases is None) == (weights is None):
            raise ConfigError("give exactly one of weights= (one phase) or phases= (a schedule)")
        self.mixture = mixture
        self.global_batch_size = global_batch_size
        self.batch_size = global_batch_size // self.world_size
        self.temperature = float(temperature)
        self.phases = check_phases(list(phases) if phases is not None else [Phase(0, weights)], mixture.names,
                                   self.temperature)
        self.seed = check_seed(seed, "MixtureSampler: seed")
        self.fingerprint = mixture.fingerprint()
        self.step = 0
        self.drawn = [0] * len(mixture.names)
        self.carry = [0.0] * len(mixture.names)
        self._perms: dict[int, tuple[int, EpochOrder]] = {}

    def probabilities(self, step: int) -> list[float]:
        """Normalised weights in force at `step`: the last phase started by then (the first starts at 0)."""
        return next(p for start, p in reversed(self.phases) if start <= step)

    def _sample(self, d: int, k: int) -> int:
        n = len(self.mixture.datasets[d])
        epoch = k // n
        cached = self._perms.get(d)
        if cached is None or cached[0] != (self.seed, epoch):
            # NOTE: a local copy: order_at may draw on the caller's thread while a producer thread draws
            cached = self._perms[d] = ((self.seed, epoch), epoch_order(n, mix_seed(self.seed, d), epoch))
        return int(cached[1].slice(k % n, k % n + 1))

    def global_batch(self) -> list[tuple[int, int]]:
        """Draw the whole global batch of the current step and advance the state."""
        batch, self.drawn, self.carry = self._draw(self.step, self.drawn, self.carry)
        self.step += 1
        return batch

    def _draw(self, step: int, drawn: list[int], carry: list[float]):
        """(the global batch of `step`, drawn after it, carry after it): self unchanged."""
        counts, carry = quota_step(self.probabilities(step), carry, self.global_batch_size)
        g = torch.Generator()
        g.manual_seed(mix_seed(self.seed, step, 1))
        slots = [d for d, c in enumerate(counts) for _ in range(c)]
        drawn, batch = list(drawn), []
        for j in torch.randperm(self.global_batch_size, generator=g).tolist():
            d = slots[j]
            batch.append((d, self._sample(d, drawn[d])))
            drawn[d] += 1
        return batch, drawn, carry

    def __iter__(self):
        lo = self.rank * self.batch_size
        while True:
            yield self.global_batch()[lo:lo + self.batch_size]

    def advance_state(self, state: dict) -> dict:
        """The state after one more global batch than `state` (the draws' order does not enter it)."""
        step, drawn, carry = int(state["step"]), list(state["drawn"]), list(state["carry"])
        counts, carry = quota_step(self.probabilities(step), carry, self.global_batch_size)
        state = {**state, "step": step + 1, "drawn": [a + c for a, c in zip(drawn, counts, strict=True)],
                 "carry": carry}
        state.pop("order", None)  # the next draws': state_with_order adds it when a state is taken
        return state

    def state_with_order(self, state: dict) -> dict:
        """`state` (from advance_state) with its order record."""
        return {**state, "order": self.order_at(state["drawn"])}

    def order_config(self) -> dict:
        return {"code": f"{MIXTURE_KIND}/{MIXTURE_CODE}", "seed": self.seed, "fingerprint": self.fingerprint,
                "global_batch_size": self.global_batch_size}

    def order_at(self, drawn: list[int]) -> dict:
        """The order record of a state: the settings and the next ORDER_PEEK draws of every dataset (whatever
        the weights: new weights or phases go on from the same draws)."""
        ids = [[self._sample(d, k) for k in range(n, n + ORDER_PEEK)] for d, n in enumerate(drawn)]
        return order_record(ids, **self.order_config())

    def state_dict(self) -> dict:
        return {"kind": MIXTURE_KIND, "version": STATE_VERSION, "step": self.step, "drawn": list(self.drawn),
                "carry": list(self.carry), "seed": self.seed, "fingerprint": self.fingerprint,
                "order": self.order_at(self.drawn)}

    def load_state_dict(self, state: dict, *, allow_new_order: bool = False) -> None:
        """Go on from `state`; allow_new_order=True: with this sampler's own settings (new weights, phases,
        seed...) from the state's position, each dataset from the draw where it stopped."""
        saved = saved_order(MIXTURE_KIND, state)
        state = check_state(state, kind=MIXTURE_KIND, fingerprint=None if allow_new_order else self.fingerprint,
                            fields=("step", "drawn", "carry", "seed"))
        if not allow_new_order:
            check_order_config(MIXTURE_KIND, saved, self.order_config())
        n = len(self.drawn)
        if isinstance(state["drawn"], list) and len(state["drawn"]) != n:
            raise StateError(f"mixture state has {len(state['drawn'])} datasets, this mixture {n}: resume with "
                             "the datasets the state was written for")
        step = state_int(MIXTURE_KIND, state, "step")
        seed = state_int(MIXTURE_KIND, state, "seed", minimum=None)
        drawn = state_ints(MIXTURE_KIND, state, "drawn", length=n)
        carry = state_floats(MIXTURE_KIND, state, "carry", length=n)
        if allow_new_order:
            self.step, self.drawn, self.carry = step, drawn, carry
            return
        if saved is not None:
            check_order_digest(MIXTURE_KIND, saved, self.order_at(drawn))
        self.step, self.seed, self.drawn, self.carry = step, seed, drawn, carry


def _setting(value, kind: type, where: str, name: str):
    """`value` of a mixture file as `kind`: int (an integral number) or float (any finite number)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or (kind is int and value != int(value)):
        raise ConfigError(f"{where}: {name} = {value!r} is not {'an integer' if kind is int else 'a number'}: write "
                          f"a plain number, without quotes (e.g. {name} = {kind(1)})")
    return kind(value)


@dataclass(frozen=True, kw_only=True)
class MixtureConfig:
    """What a mixture file holds: datasets (name -> cache dir), phases, temperature, seed."""

    datasets: Mapping[str, str]
    phases: Sequence[Phase]
    temperature: float = TEMPERATURE
    seed: int = 0
    split: str = "train"

    @classmethod
    def from_dict(cls, raw: Mapping, where: str = "<dict>") -> MixtureConfig:
        """The settings of a mixture file (`where` names it in errors): every key known, every value its type."""
        unknown = ", ".join(sorted(map(str, set(raw) - set(FILE_KEYS)))) if isinstance(raw, Mapping) else None
        if unknown != "":
            raise ConfigError(f"{where}: {f'unknown setting(s) {unknown}' if unknown else 'not a table'}; a mixture "
                              f"file is a table of {', '.join(FILE_KEYS)}")
        if not isinstance(raw.get("datasets"), Mapping) or not raw["datasets"]:
            raise ConfigError(f"{where}: 'datasets' must be a table of name -> cache directory")
        if ("weights" in raw) == ("phases" in raw):
            raise ConfigError(f"{where}: give exactly one of 'weights' (a table) or 'phases' (a list)")
        phases = raw["phases"] if "phases" in raw else [{"start_step": 0, "weights": raw["weights"]}]
        if not isinstance(phases, list):  # (a table's keys would be read as its phases)
            raise ConfigError(f"{where}: phases is {phases!r}; 'phases' is a list of tables of start_step and weights")
        for k, p in enumerate(phases):
            name = "" if "weights" in raw else f"phases[{k}]."
            if not (isinstance(p, Mapping) and sorted(p) == ["start_step", "weights"] and isinstance(p["weights"],
                                                                                             Mapping)):
                raise ConfigError(f"{where}: {name.rstrip('.') or 'weights'} is {raw.get('weights', p)!r}; 'weights' is a "
                                  "table, 'phases' a list of tables of start_step (int) and weights, nothing else")
            _setting(p["start_step"], int, where, f"{name}start_step")
            for d, w in p["weights"].items():
                _setting(w, float, where, f"{name}weights.{d}")
        return cls(datasets={str(k): str(v) for k, v in raw["datasets"].items()},
                   phases=[Phase(int(p["start_step"]), dict(p["weights"])) for p in phases],
                   temperature=_setting(raw.get("temperature", TEMPERATURE), float, where, "temperature"),
                   seed=_setting(raw.get("seed", 0), int, where, "seed"), split=str(raw.get("split", "train")))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> MixtureConfig:
        """Read a .json or .toml mixture file; relative cache paths resolve against the file's folder (URLs stay)."""
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text("utf-8")) if p.suffix == ".toml" else json.loads(p.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{p}: cannot read mixture config ({exc}); expected JSON or TOML") from exc
        cfg = cls.from_dict(raw, str(p))
        return replace(cfg, datasets={n: d if is_url(d) else str(p.parent / d) for n, d in cfg.datasets.items()})

    def build(self, T: int, global_batch_size: int, *, rank: int | None = None,
              world_size: int | None = None) -> tuple[MixtureDataset, MixtureSampler]:
        """Open every cache as IndexedWindowDataset(T) and return (dataset, batch sampler)."""
        mix = MixtureDataset({n: IndexedWindowDataset(d, T, split=self.split) for n, d in self.datasets.items()})
        return mix, MixtureSampler(mix, global_batch_size, phases=self.phases, temperature=self.temperature,
                                   seed=self.seed, rank=rank, world_size=world_size)
