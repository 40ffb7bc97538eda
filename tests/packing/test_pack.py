"""SFT cache -> packed shard: coverage, invariants, masks, determinism, overflow, provenance, rejections."""

import json
import subprocess
import sys

import numpy as np
import pytest

from niels_gpt.cache.meta import sha256_file
from niels_gpt.cache.sft_dataset import assistant_span_mask
from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.packing import ALGORITHMS, PackedMemmapDataset, pack_sft

from ..conftest import write_pretrain_cache, write_sft_cache
from .helpers import ASST, EOT, chats


@pytest.fixture
def cache(tmp_path):
    return write_sft_cache(tmp_path / "sft", chats(300, seed=1), chats(20, seed=2))


def _sequences(ds):
    """Every packed sequence as (tokens tuple, loss mask list), bin by bin."""
    out = []
    for i in range(len(ds)):
        it = ds[i]
        b = it["seq_boundaries"].tolist()
        for s, e in zip(b[:-1], b[1:], strict=True):
            out.append((tuple(it["input_ids"][s:e].tolist()), it["loss_mask"][s:e].tolist()))
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_example_in_exactly_one_bin_with_its_shifted_mask(tmp_path, cache, algorithm):
    m = pack_sft(cache, tmp_path / "p", pack_size=256, algorithm=algorithm, seed=3)
    ds = PackedMemmapDataset(tmp_path / "p")
    ds.validate()
    seqs = _sequences(ds)
    examples = chats(300, seed=1)
    assert sorted(s for s, _ in seqs) == sorted(tuple(e) for e in examples)
    assert m["num_sequences"] == 300 and m["truncated"] == 0 and m["algorithm"] == algorithm
    for tokens, loss in seqs:
        trained = assistant_span_mask(np.array(tokens), ASST, EOT)
        assert loss == trained[1:].astype(int).tolist() + [0]


def test_seq_starts_begin_at_zero_increase_and_stay_below_packed_len(tmp_path, cache):
    pack_sft(cache, tmp_path / "p", pack_size=200, algorithm="bfd")
    offsets = np.load(tmp_path / "p" / "seq_offsets.npy")
    starts = np.load(tmp_path / "p" / "seq_starts.npy").astype(np.int64)
    plen = np.load(tmp_path / "p" / "packed_len.npy")
    assert offsets[0] == 0 and offsets[-1] == len(starts) == 300
    for b in range(len(plen)):
        s = starts[offsets[b]:offsets[b + 1]]
        assert s[0] == 0 and (np.diff(s) > 0).all() and s[-1] < plen[b] <= 200


def test_mask_never_crosses_a_boundary(tmp_path, cache):
    pack_sft(cache, tmp_path / "p", pack_size=256)
    ds = PackedMemmapDataset(tmp_path / "p")
    crossings = 0
    for i in range(len(ds)):
        it = ds[i]
        ends = it["seq_boundaries"][1:] - 1
        crossings += int(it["loss_mask"][ends].sum())
    assert crossings == 0
    # every example ends with a trained EOT, so a single roll would have produced one crossing per
    # sequence after the first in each bin
    assert len(ds) < 300


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_packing_is_deterministic_byte_for_byte(tmp_path, cache, algorithm):
    for out in ("a", "b"):
        pack_sft(cache, tmp_path / out, pack_size=128, algorithm=algorithm, seed=11)
    for name in ("input_ids.npy", "loss_mask.npy", "packed_len.npy", "seq_offsets.npy", "seq_starts.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    ma = json.loads((tmp_path / "a" / "manifest.json").read_text())
    mb = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert ma == mb


def test_long_examples_are_truncated_and_counted(tmp_path):
    long = [4] + [20] * 50 + [6, 5] + [30] * 40 + [6]  # 94 tokens
    short = [4, 21, 6, 5, 31, 6]
    write_sft_cache(tmp_path / "c", [long, short])
    m = pack_sft(tmp_path / "c", tmp_path / "p", pack_size=64)
    assert m["truncated"] == 1 and m["num_sequences"] == 2
    seqs = _sequences(PackedMemmapDataset(tmp_path / "p"))
    assert sorted(s for s, _ in seqs) == sorted([tuple(long[:64]), tuple(short)])
    cut = next(loss for s, loss in seqs if len(s) == 64)
    # assistant tokens 53..63 survive the cut: positions 52..62 predict them; the last position is 0
    assert cut == [0] * 52 + [1] * 11 + [0]


def test_reject_mode_names_the_example_and_the_fix(tmp_path):
    write_sft_cache(tmp_path / "c", [[4, 21, 6, 5, 31, 6], [4] + [20] * 70 + [6]])
    with pytest.raises(ConfigError, match=r"example 1 has 72 tokens, more than pack_size=64 .*--on-overflow truncate"):
        pack_sft(tmp_path / "c", tmp_path / "p", pack_size=64, on_overflow="reject")
    assert not (tmp_path / "p").exists()


def test_manifest_records_provenance(tmp_path, cache):
    m = pack_sft(cache, tmp_path / "p", pack_size=512, split="val", algorithm="bfd", seed=4)
    assert m["source"]["split"] == "val"
    assert m["source"]["tokens_sha256"] == sha256_file(str(cache / "val_tokens.bin"))
    assert m["source"]["meta_sha256"] == sha256_file(str(cache / "meta.json"))
    assert m["seed"] == 4 and m["on_overflow"] == "truncate" and m["pack_size"] == 512
    tokens = sum(len(e) for e in chats(20, seed=2))
    assert m["num_tokens"] == tokens and m["efficiency"] == pytest.approx(tokens / (m["num_bins"] * 512))


def test_uint32_cache_packs_the_same_tokens(tmp_path):
    ex = chats(30, seed=5)
    write_sft_cache(tmp_path / "c16", ex)
    write_sft_cache(tmp_path / "c32", ex, dtype="uint32-le")
    pack_sft(tmp_path / "c16", tmp_path / "p16", pack_size=128)
    pack_sft(tmp_path / "c32", tmp_path / "p32", pack_size=128)
    assert (tmp_path / "p16" / "input_ids.npy").read_bytes() == (tmp_path / "p32" / "input_ids.npy").read_bytes()


def test_rejects_a_pretraining_cache(tmp_path):
    write_pretrain_cache(tmp_path / "pre", {"train": [np.arange(10)]})
    with pytest.raises(CacheError, match="kind is 'pretrain', expected 'sft'"):
        pack_sft(tmp_path / "pre", tmp_path / "p")


def test_rejects_an_empty_split_and_an_unknown_one(tmp_path):
    write_sft_cache(tmp_path / "c", chats(3))
    with pytest.raises(ConfigError, match="split 'val' has no examples"):
        pack_sft(tmp_path / "c", tmp_path / "p", split="val")
    with pytest.raises(ConfigError, match="split must be one of train, val"):
        pack_sft(tmp_path / "c", tmp_path / "p", split="test")


def test_rejects_a_cache_whose_files_disagree_with_meta(tmp_path):
    write_sft_cache(tmp_path / "c", chats(3))
    with open(tmp_path / "c" / "train_tokens.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(CacheError, match="train_tokens.bin: .* bytes on disk, meta says"):
        pack_sft(tmp_path / "c", tmp_path / "p")


def test_rejects_unknown_overflow_mode(tmp_path, cache):
    with pytest.raises(ConfigError, match="on_overflow must be one of truncate, reject"):
        pack_sft(cache, tmp_path / "p", on_overflow="drop")


@pytest.mark.parametrize("algorithm", ["ffd", "bfd", "first_fit_shuffle"])
def test_pack_sft_imports_no_torch(tmp_path, algorithm):
    """Every algorithm packs with numpy alone: `pack-sft` starts in a fraction of a second; first_fit_shuffle's
    order is torch.randperm's (its recorded rule), drawn without torch (niels_gpt/seeds.py)."""
    write_sft_cache(tmp_path / "c", chats(40, seed=3))
    code = ("import sys\nfrom niels_gpt.cli import main\nrc = main(sys.argv[1:])\n"
            "print('torch' in sys.modules)\nsys.exit(rc)")
    run = subprocess.run([sys.executable, "-c", code, "pack-sft", str(tmp_path / "c"), str(tmp_path / "p"),
                          "--seq-len", "512", "--algorithm", algorithm], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "False"
    assert (tmp_path / "p" / "manifest.json").exists()


def test_a_cache_given_by_url_is_refused_as_a_url(tmp_path):
    """pack-sft CACHE_DIR reads a local cache; a URL was read as the path "s3:/b/..." and refused as an unfinished
    build ("no meta.json ...; re-run build-all"). It is refused as a URL, and nothing is written."""
    with pytest.raises(ConfigError, match="s3://bucket/sft/dolly: pack-sft reads a local SFT cache, not a URL"):
        pack_sft("s3://bucket/sft/dolly", tmp_path / "p", pack_size=64)
    assert not (tmp_path / "p").exists()
