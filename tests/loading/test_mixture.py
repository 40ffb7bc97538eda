"""Mixtures: proportions, phase switches, wrap-around without bias, determinism, exact resumption."""

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from itertools import islice

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading import IndexedWindowDataset, MixtureConfig, MixtureDataset, MixtureSampler, Phase
from niels_gpt.loading.mixture import normalised, quota_step
from niels_gpt.resume import fingerprint

from ..conftest import REPO, write_pretrain_cache


class Const(Dataset):
    def __init__(self, n, base):
        self.n, self.base = n, base

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"value": torch.tensor(self.base + i)}

    def fingerprint(self):
        return fingerprint("const", self.n, self.base)


def mixture():
    return MixtureDataset({"web": Const(1000, 0), "books": Const(300, 10_000), "tiny": Const(7, 20_000)})


def test_proportions_follow_weights_within_one_sample():
    s = MixtureSampler(mixture(), 32, weights={"web": 0.6, "books": 0.3, "tiny": 0.1}, seed=0, rank=0, world_size=1)
    counts = Counter()
    for step in range(1, 201):
        counts.update(d for d, _ in s.global_batch())
        for d, p in enumerate([0.6, 0.3, 0.1]):
            assert abs(counts[d] - p * 32 * step) <= 1.0 + 1e-9


def test_phase_switches_at_its_start_step():
    s = MixtureSampler(mixture(), 10, phases=[Phase(0, {"web": 1.0}), Phase(5, {"books": 1.0})], seed=0,
                       rank=0, world_size=1)
    kinds = [{d for d, _ in s.global_batch()} for _ in range(8)]
    assert kinds == [{0}] * 5 + [{1}] * 3


def test_temperature_flattens_weights():
    assert normalised([0.8, 0.2], 1.0) == pytest.approx([0.8, 0.2])
    assert normalised([0.8, 0.2], 2.0) == pytest.approx([2 / 3, 1 / 3])


def test_quota_worked_example():
    counts, carry = quota_step([0.5, 0.3, 0.2], [0.0, 0.0, 0.0], 4)
    assert counts == [2, 1, 1] and carry == pytest.approx([0.0, 0.2, -0.2])


def test_oversampled_small_dataset_wraps_in_whole_permutations():
    s = MixtureSampler(mixture(), 16, weights={"web": 1, "tiny": 1}, seed=3, rank=0, world_size=1)
    tiny = [i for _ in range(40) for d, i in s.global_batch() if d == 2]
    assert len(tiny) == 320
    passes = [tiny[k:k + 7] for k in range(0, 315, 7)]
    assert all(sorted(p) == list(range(7)) for p in passes)  # every pass covers each sample once
    assert len({tuple(p) for p in passes}) > 1  # and passes are differently ordered


def test_items_are_tagged_and_batches_do_not_depend_on_workers_or_world_size():
    mix = mixture()
    runs = []
    for W, nw in ((1, 0), (2, 2), (4, 1)):
        per_rank = []
        for r in range(W):
            s = MixtureSampler(mix, 16, weights={"web": 2, "books": 1, "tiny": 1}, seed=9, rank=r, world_size=W)
            loader = DataLoader(mix, batch_sampler=s, num_workers=nw)
            it = iter(loader)
            per_rank.append([next(it) for _ in range(5)])
        runs.append([(torch.cat([per_rank[r][t]["value"] for r in range(W)]).tolist(),
                      torch.cat([per_rank[r][t]["dataset"] for r in range(W)]).tolist()) for t in range(5)])
    assert runs[0] == runs[1] == runs[2]
    values, tags = runs[0][0]
    assert all(v // 10_000 == d for v, d in zip(values, tags, strict=True))


def test_resume_continues_exactly():
    def make():
        return MixtureSampler(mixture(), 12, phases=[Phase(0, {"web": 1, "books": 1}), Phase(4, {"tiny": 1, "web": 3})],
                              temperature=1.5, seed=5, rank=0, world_size=1)

    ref = make()
    full = [ref.global_batch() for _ in range(10)]
    head = make()
    for _ in range(3):
        head.global_batch()
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(head.state_dict())))
    assert [resumed.global_batch() for _ in range(7)] == full[3:]


def test_state_of_another_mixture_is_rejected():
    state = MixtureSampler(mixture(), 4, weights={"web": 1}, seed=0, rank=0, world_size=1).state_dict()
    other = MixtureDataset({"web": Const(1000, 0), "books": Const(301, 10_000), "tiny": Const(7, 20_000)})
    with pytest.raises(StateError, match="does not match"):
        MixtureSampler(other, 4, weights={"web": 1}, seed=0, rank=0, world_size=1).load_state_dict(state)


@pytest.mark.parametrize("kwargs,match", [
    ({"weights": {"web": 1, "news": 1}}, "unknown dataset\\(s\\) \\['news'\\]"),
    ({"weights": {"web": 0}}, "not all 0"),
    ({"phases": [Phase(3, {"web": 1})]}, "the first must be 0"),
    ({"phases": [Phase(0, {"web": 1}), Phase(0, {"books": 1})]}, "strictly increase"),
    ({"weights": {"web": 1}, "temperature": 0}, "temperature 0.0 must be > 0"),
    ({}, "exactly one of weights"),
])
def test_bad_mixture_settings_are_rejected(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MixtureSampler(mixture(), 4, seed=0, rank=0, world_size=1, **kwargs)


def test_mixture_from_toml_and_json_files(tmp_path):
    write_pretrain_cache(tmp_path / "a", {"train": [np.arange(50)]})
    write_pretrain_cache(tmp_path / "b", {"train": [np.arange(1000, 1030)]})
    (tmp_path / "mix.toml").write_text(
        'seed = 1\ntemperature = 1.0\n[datasets]\na = "a"\nb = "b"\n'
        '[[phases]]\nstart_step = 0\nweights = { a = 1.0 }\n[[phases]]\nstart_step = 2\nweights = { b = 1.0 }\n')
    (tmp_path / "mix.json").write_text(json.dumps({"seed": 1, "datasets": {"a": "a", "b": "b"}, "phases": [
        {"start_step": 0, "weights": {"a": 1.0}}, {"start_step": 2, "weights": {"b": 1.0}}]}))
    outs = []
    for name in ("mix.toml", "mix.json"):
        mix, sampler = MixtureConfig.from_file(tmp_path / name).build(T=4, global_batch_size=4, rank=0, world_size=1)
        assert isinstance(mix.datasets[0], IndexedWindowDataset)
        it = iter(sampler)
        batches = [[mix[i] for i in next(it)] for _ in range(3)]
        assert [{item["dataset"] for item in b} for b in batches] == [{0}, {0}, {1}]
        assert all(item["input_ids"][0] >= 1000 for item in batches[2])
        outs.append([[item["input_ids"].tolist() for item in b] for b in batches])
    assert outs[0] == outs[1]


def test_a_toml_mixture_file_reads_without_tomllib_as_on_python_3_10(tmp_path):
    """Python 3.10 (the package's minimum) has no tomllib: the package imports and reads a TOML mixture file
    with tomli there (a dependency below 3.11), with the same values and the same refusal of a broken file."""
    (tmp_path / "mix.toml").write_text('seed = 3\n[datasets]\na = "a"\n[weights]\na = 1.0\n')
    (tmp_path / "bad.toml").write_text("datasets = [")
    code = ("import sys; sys.modules['tomllib'] = None\n"  # `import tomllib` now fails, as on 3.10
            "from niels_gpt.errors import ConfigError\nfrom niels_gpt.loading.mixture import MixtureConfig\n"
            f"cfg = MixtureConfig.from_file({str(tmp_path / 'mix.toml')!r})\n"
            "print(cfg.seed, cfg.phases[0].weights, sorted(cfg.datasets))\n"
            f"try:\n    MixtureConfig.from_file({str(tmp_path / 'bad.toml')!r})\n"
            "except ConfigError as e:\n    print('refused:', e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "3 {'a': 1.0} ['a']"
    assert lines[1].startswith("refused:") and "cannot read mixture config" in lines[1]


def test_mixture_file_without_weights_is_rejected(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"datasets": {"a": "a"}}))
    with pytest.raises(ConfigError, match="exactly one of 'weights'"):
        MixtureConfig.from_file(tmp_path / "m.json")
    (tmp_path / "bad.toml").write_text("datasets = [")
    with pytest.raises(ConfigError, match="cannot read mixture config"):
        MixtureConfig.from_file(tmp_path / "bad.toml")


def _values(batch):
    return batch["value"].tolist() + batch["dataset"].tolist()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resumable_loader_resumes_a_mixture_exactly_whatever_the_workers(num_workers):
    from niels_gpt.loading import ResumableDataLoader

    def loader(workers):
        s = MixtureSampler(mixture(), 8, phases=[Phase(0, {"web": 0.7, "books": 0.2, "tiny": 0.1}),
                                                 Phase(5, {"books": 0.5, "tiny": 0.5})],
                           seed=4, rank=0, world_size=1)
        return ResumableDataLoader(mixture(), s, num_workers=workers)

    straight = loader(0)
    expected = [_values(b) for b in islice(straight, 12)]
    first = loader(num_workers)
    got = []
    for b in islice(first, 5):  # workers have prefetched beyond step 5 by now
        got.append(_values(b))
    state = json.loads(json.dumps(first.state_dict()))
    assert state["step"] == 5
    second = loader(num_workers)
    second.load_state_dict(state)
    got += [_values(b) for b in islice(second, 7)]
    assert got == expected


def test_resumable_loader_reiterated_after_a_break_draws_the_prefetched_batches_again():
    from niels_gpt.loading import ResumableDataLoader

    s = MixtureSampler(mixture(), 8, weights={"web": 1, "books": 1}, seed=1, rank=0, world_size=1)
    expected = [_values(b) for b in islice(ResumableDataLoader(mixture(), s), 6)]
    s = MixtureSampler(mixture(), 8, weights={"web": 1, "books": 1}, seed=1, rank=0, world_size=1)
    dl = ResumableDataLoader(mixture(), s, num_workers=2)
    got = [_values(b) for b in islice(dl, 3)]
    got += [_values(b) for b in islice(dl, 3)]
    assert got == expected


def test_resumable_loader_refuses_a_sampler_without_state():
    from niels_gpt.loading import ResumableDataLoader

    with pytest.raises(ConfigError, match="GlobalBatchSampler or a MixtureSampler"):
        ResumableDataLoader(mixture(), [[0, 1]])


@pytest.mark.parametrize("change, match", [
    ({"temprature": 2.0}, "mix.json: unknown setting.s. temprature; a mixture file is a table of datasets"),
    ({"temperature": "hot"}, r"mix.json: temperature = 'hot' is not a number"),
    ({"seed": 1.7}, r"mix.json: seed = 1.7 is not an integer"),
    ({"weights": {"a": "lots"}}, r"mix.json: weights.a = 'lots' is not a number"),
    ({"weights": None, "phases": [{"start_step": 1.5, "weights": {"a": 1}}]}, r"phases\[0\].start_step = 1.5"),
    ({"weights": None, "phases": [{"start": 0, "weights": {"a": 1}}]}, r"phases\[0\] is \{'start': 0"),
    ({"weights": None, "phases": {"start_step": 0, "weights": {"a": 1}}}, r"phases is \{'start_step': 0.*a list"),
])
def test_a_mixture_file_with_an_unknown_setting_or_a_value_of_the_wrong_type_is_refused_naming_it(tmp_path, change,
                                                                                                   match):
    """A misspelt setting was ignored (the run went on with the default), a fractional seed or step was cut to an
    integer, and a word where a number belongs raised a bare ValueError naming no file."""
    raw = {"seed": 0, "datasets": {"a": "a"}, "weights": {"a": 1.0}, **change}
    (tmp_path / "mix.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    with pytest.raises(ConfigError, match=match):
        MixtureConfig.from_file(tmp_path / "mix.json")


def test_a_mixture_file_naming_caches_by_url_keeps_the_urls(tmp_path):
    """Relative cache paths resolve against the file's folder; a URL was joined to it too ("s3://b/c" became
    "<folder>/s3:/b/c", a local path that does not exist). URLs are kept as written."""
    write_pretrain_cache(tmp_path / "a", {"train": [np.arange(50)]})
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "mix.json").write_text(json.dumps({"datasets": {"a": f"file://{tmp_path / 'a'}",
                                                                      "s3": "s3://bucket/caches/web", "rel": "../a"},
                                                         "weights": {"a": 1.0}}))
    cfg = MixtureConfig.from_file(tmp_path / "m" / "mix.json")
    assert cfg.datasets == {"a": f"file://{tmp_path / 'a'}", "s3": "s3://bucket/caches/web",
                            "rel": str(tmp_path / "m" / "../a")}
    mix, _ = replace(cfg, datasets={"a": cfg.datasets["a"]}).build(T=4, global_batch_size=4, rank=0, world_size=1)
    assert mix[(0, 0)]["input_ids"].tolist() == [0, 1, 2, 3]
