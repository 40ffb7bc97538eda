"""Bad-input catalogue: the window readers' Python API (sizes a caller passes to the datasets and their batches).

These inputs never come through the command line (its flags are parsed as ints), so each case is a call: it must
raise the package's own error (ConfigError) as one line naming the call and the argument, what it got and how to
fix it, before anything is read. CASES (command-line cases, collected by test_bad_input_catalogue.all_cases) is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from niels_gpt.errors import ConfigError

from .conftest import write_pretrain_cache

CASES: list = []


@dataclass
class ApiCase:
    name: str
    call: Callable  # (pretrain cache dir) -> the call that must refuse
    expect: tuple[str, ...]  # phrases the one error line contains (case-insensitive)


def _stream(cache, T=8):
    from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset

    return PretrainTokenStreamDataset(str(cache / "train"), T=T, device="cpu")


def _indexed(cache, T=8):
    from niels_gpt.loading.windows import IndexedWindowDataset

    return IndexedWindowDataset(cache, T)


def _batch(B):
    return lambda c: _stream(c).get_batch(B=B, generator=torch.Generator())


API_CASES = [
    ApiCase("get_batch B is a float", _batch(2.0), ("get_batch", "B=2.0", "float", "positive int")),
    ApiCase("get_batch B is a string", _batch("32"), ("get_batch", "B='32'", "str", "positive int")),
    ApiCase("get_batch B is a bool", _batch(True), ("get_batch", "B=True", "bool", "positive int")),
    ApiCase("get_batch B is None", _batch(None), ("get_batch", "B=None", "NoneType", "positive int")),
    ApiCase("get_batch B is zero", _batch(0), ("get_batch", "B=0", "at least 1")),
    ApiCase("random windows T is a float", lambda c: _stream(c, T=8.0), ("PretrainTokenStreamDataset", "T=8.0", "float")),
    ApiCase("random windows T is a bool", lambda c: _stream(c, T=True), ("PretrainTokenStreamDataset", "T=True", "bool")),
    ApiCase("indexed windows T is a float", lambda c: _indexed(c, T=2.5), ("IndexedWindowDataset", "T=2.5", "float")),
    ApiCase("indexed windows T is a string", lambda c: _indexed(c, T="8"), ("IndexedWindowDataset", "T='8'", "str")),
    ApiCase("indexed windows T is negative", lambda c: _indexed(c, T=-3), ("IndexedWindowDataset", "T=-3", "at least 1")),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return write_pretrain_cache(tmp_path_factory.mktemp("readers") / "c",
                                {"train": [np.arange(200), np.arange(300)], "val": [np.arange(50)]})


@pytest.mark.parametrize("case", API_CASES, ids=[c.name for c in API_CASES])
def test_bad_reader_input_gets_one_clear_line(case, cache):
    with pytest.raises(ConfigError) as info:
        case.call(cache)
    line = str(info.value)
    assert "\n" not in line
    for phrase in case.expect:
        assert phrase.lower() in line.lower(), (phrase, line)


def test_numpy_integer_sizes_are_the_ints_they_are(cache):
    x, _ = _stream(cache, T=np.int64(8)).get_batch(B=np.int64(3), generator=torch.Generator())
    assert x.shape == (3, 8) and _indexed(cache, T=np.int32(8)).T == 8
