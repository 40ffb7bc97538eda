"""Every count a reader indexes with is checked against the file's bytes on open, by the one validator that
`verify` runs too: an edited meta.json is a clear error, never a crash, an out-of-file read or a changed batch."""

import json

import numpy as np
import pytest
import torch

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import CacheError
from niels_gpt.loading import IndexedWindowDataset
from niels_gpt.report import verify_path
from niels_gpt.seals import sealed_bytes

from .conftest import write_pretrain_cache, write_sft_cache


@pytest.fixture
def cache(tmp_path):
    g = torch.Generator().manual_seed(0)
    shards = {"train": [torch.randint(7, 500, (n,), generator=g).numpy().astype(np.uint16) for n in (300, 200)],
              "val": [np.arange(7, 107, dtype=np.uint16)]}
    return write_pretrain_cache(tmp_path / "c", shards)


def _edit(cache, rel, change):
    meta = json.loads((cache / "meta.json").read_text())
    change(meta["files"][rel])
    (cache / "meta.json").write_bytes(sealed_bytes(meta))  # sealed: the record checks below it are tested


def _readers(cache):
    yield lambda: PretrainTokenStreamDataset(str(cache / "train"), T=16, device="cpu").get_batch(
        B=64, generator=torch.Generator().manual_seed(0))
    yield lambda: IndexedWindowDataset(cache, T=16)[0]


@pytest.mark.parametrize("tokens", [50_000_000, 301, 299])
def test_an_edited_token_count_is_refused_by_every_reader_and_by_verify(cache, tokens):
    _edit(cache, "train/shard_00000.bin", lambda r: r.update(tokens=tokens))
    for read in _readers(cache):
        with pytest.raises(CacheError, match=rf"says {tokens} tokens but 600 bytes of uint16-le \(300 tokens\)"):
            read()
    problems, _ = verify_path(str(cache))
    assert any(f"says {tokens} tokens" in p for p in problems)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("sha256"), r"has no 'sha256'"),
    (lambda r: r.update(size=r.pop("bytes")), r"has no 'bytes'"),
    (lambda r: r.update(bytes="600"), r"'bytes' is '600', not a count"),
    (lambda r: r.update(tokens=-1), r"'tokens' is -1, not a count"),
    (lambda r: r.update(sha256="xyz"), r"'sha256' is 'xyz', not 64 hex digits"),
])
def test_a_damaged_file_record_is_one_clear_error(cache, change, message):
    _edit(cache, "train/shard_00000.bin", change)
    for read in _readers(cache):
        with pytest.raises(CacheError, match=message):
            read()
    problems, _ = verify_path(str(cache))
    assert len(problems) == 1 and "its record in meta.json" in problems[0]


def test_sft_reader_checks_the_token_count_too(tmp_path):
    out = write_sft_cache(tmp_path / "s", [[4, 7, 5, 8, 6], [4, 9, 5, 10, 6]])
    _edit(out, "train_tokens.bin", lambda r: r.update(tokens=r["tokens"] + 1))
    with pytest.raises(CacheError, match="says 11 tokens but 20 bytes"):
        SFTExampleDataset(str(out / "train_tokens.bin"), str(out / "train_idx.npy"), T=4, device="cpu", eot_id=6)
