"""Compressed shards (build --compress zstd, convert --compress zstd): the same batches bit for bit as the
uncompressed cache, the standard zstd seekable layout, and every damage caught by the reader or verify."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from niels_gpt import _native
from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.writers import ShardWriter
from niels_gpt.formats.zstd_shard import FRAME_TOKENS, ZstdShard
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.report import verify_path
from niels_gpt.seals import sealed_bytes

pytest.importorskip("zstandard")


def _build(tokenizer, docs, out, compress=None):
    build_pretrain_cache(docs, str(out), tokenizer=tokenizer, max_train_tokens=60_000, max_val_tokens=3_000,
                         shard_bytes=3 * FRAME_TOKENS * 2 + 1_000, seed=7, shuffle_buffer=None, compress=compress)
    return out


@pytest.fixture(scope="module")
def pair(tokenizer, real_docs, tmp_path_factory):
    """The sample corpus built twice, uncompressed and compressed (shards of 3 frames and a bit)."""
    root = tmp_path_factory.mktemp("zstd")
    return _build(tokenizer, real_docs, root / "raw"), _build(tokenizer, real_docs, root / "zst", "zstd")


def _copy(pair, tmp_path):
    out = tmp_path / "zst"
    shutil.copytree(pair[1], out)
    return out


def test_a_compressed_cache_holds_the_same_shards_and_is_smaller(pair):
    raw, zst = pair
    m_raw, m_zst = (json.loads((c / "meta.json").read_text()) for c in pair)
    assert [r.removesuffix(".zst") for r in m_zst["files"]] == list(m_raw["files"])
    for rel, rec in m_raw["files"].items():
        z = m_zst["files"][rel + ".zst"]
        assert z["tokens"] == rec["tokens"] and z["frames"] == -(-rec["tokens"] // FRAME_TOKENS)
        assert z["bytes"] < rec["bytes"]
    assert m_zst["compression"]["codec"] == "zstd" and m_zst["compression"]["frame_tokens"] == FRAME_TOKENS
    assert "compression" not in m_raw and m_zst["totals"] == m_raw["totals"]
    assert verify_path(str(zst)) == ([], 1)


def test_the_shard_is_a_zstd_stream_that_decompresses_to_the_raw_shard(pair):
    import zstandard

    raw, zst = pair
    for p in sorted((raw / "train").glob("*.bin")):
        data = (zst / "train" / (p.name + ".zst")).read_bytes()
        assert zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read() == p.read_bytes()
        if shutil.which("zstd"):
            out = subprocess.run(["zstd", "-d", "-c"], input=data, capture_output=True, check=True).stdout
            assert out == p.read_bytes()


@pytest.mark.parametrize("T", [700, 2100])  # windows across one frame boundary, and across two
@pytest.mark.parametrize("frame_cache_bytes", [None, 16 * FRAME_TOKENS * 2])  # everything, or 16 frames
def test_random_window_batches_equal_the_uncompressed_cache_bit_for_bit(pair, T, frame_cache_bytes, monkeypatch):
    kw = {} if frame_cache_bytes is None else {"frame_cache_bytes": frame_cache_bytes}
    for native in (_native.gather, None):  # the C kernel and the numpy path
        monkeypatch.setattr(_native, "gather", native)
        a = PretrainTokenStreamDataset(str(pair[0] / "train"), T=T, device="cpu")
        b = PretrainTokenStreamDataset(str(pair[1] / "train"), T=T, device="cpu", **kw)
        ga, gb = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        for B in (8, 5, 8):
            for _ in range(4):
                xa, ya = a.get_batch(B=B, generator=ga)
                xb, yb = b.get_batch(B=B, generator=gb)
                assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(ga.get_state(), gb.get_state())
        fc = b.core.frames
        assert fc.count <= fc.capacity and fc.loaded >= fc.count
        if frame_cache_bytes is not None:
            assert fc.loaded > fc.capacity  # it did evict, and still served the same tokens


def test_indexed_windows_and_inspect_read_compressed_shards(pair):
    a, b = IndexedWindowDataset(pair[0], 300), IndexedWindowDataset(pair[1], 300)
    assert len(a) == len(b)
    for i in list(range(0, len(a), 7)) + [len(a) - 1]:
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"]) and torch.equal(a[i]["labels"], b[i]["labels"])
    assert b.shard_files([0, len(b) - 1]) == ["train/shard_00000.bin.zst", f"train/{b.paths[-1].name}"]
    ra = PretrainTokenStreamDataset(str(pair[0] / "train"), T=50, device="cpu")
    rb = PretrainTokenStreamDataset(str(pair[1] / "train"), T=50, device="cpu")
    shard, local = np.array([0, 1, 2]), np.array([0, FRAME_TOKENS - 3, 17])
    assert np.array_equal(ra.gather(shard, local), rb.gather(shard, local))


def test_convert_compress_writes_the_tokens_of_the_source(pair, tmp_path):
    out = tmp_path / "conv"
    convert(pair[0], out, to="niels", compress="zstd", shard_bytes=4096)
    assert verify_path(str(out)) == ([], 1)
    assert all(p.name.endswith(".bin.zst") for p in (out / "train").iterdir())
    a = PretrainTokenStreamDataset(str(pair[0] / "train"), T=64, device="cpu")
    b = PretrainTokenStreamDataset(str(out / "train"), T=64, device="cpu")
    assert a.num_tokens == b.num_tokens
    with pytest.raises(ConfigError, match="--compress applies to --to niels .* not --to nanogpt"):
        convert(pair[0], tmp_path / "n", to="nanogpt", compress="zstd")
    with pytest.raises(ConfigError, match="--compress 'lz4': expected one of zstd"):
        convert(pair[0], tmp_path / "l", to="niels", compress="lz4")


def _first_batch(cache, T=700):
    ds = PretrainTokenStreamDataset(str(cache / "train"), T=T, device="cpu")
    g = torch.Generator().manual_seed(0)
    return [ds.get_batch(B=16, generator=g) for _ in range(20)]


def test_a_flipped_byte_in_a_frame_is_refused_by_the_reader_and_named_by_verify(pair, tmp_path):
    out = _copy(pair, tmp_path)
    shard = out / "train" / "shard_00001.bin.zst"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x04  # inside frame 0 or 1: payload, not the seek table
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheMismatchError, match=r"shard_00001\.bin\.zst: frame \d .*(does not decompress|checksum)"):
        _first_batch(out)
    problems, _ = verify_path(str(out))
    assert any("sha256" in p for p in problems) and any(": frame " in p for p in problems)


@pytest.mark.parametrize("where, match", [
    (-1, "seekable magic"),                              # the file's last byte
    (-5, "seek table descriptor"),
    (-9, r"frames in its seek table, expected 4"),       # the frame count
    ("entry-size", r"frame 1 decompresses to \d+ bytes by its seek table|frames of \d+ bytes in the seek table"),
])
def test_a_damaged_frame_index_is_refused_on_open(pair, tmp_path, where, match):
    out = _copy(pair, tmp_path)
    shard = out / "train" / "shard_00000.bin.zst"
    data = bytearray(shard.read_bytes())
    n = 4
    if where == "entry-size":  # entry 1's decompressed size
        pos = len(data) - 9 - 12 * n + 12 * 1 + 4
    else:
        pos = len(data) + where
    data[pos] ^= 0x01
    shard.write_bytes(bytes(data))
    rec = json.loads((out / "meta.json").read_text())["files"]["train/shard_00000.bin.zst"]
    with pytest.raises(CacheMismatchError, match=match):
        ZstdShard(shard, np.dtype("<u2"), tokens=rec["tokens"], frame_tokens=FRAME_TOKENS, expected_bytes=rec["bytes"])
    problems, _ = verify_path(str(out))
    assert any("shard_00000.bin.zst" in p and "sha256" in p for p in problems)


def test_an_edited_frame_size_in_meta_json_is_refused(pair, tmp_path):
    out = _copy(pair, tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    meta.pop("record_sha256", None)
    meta["compression"]["frame_tokens"] = 2048
    # sealed: a record that is wrong but consistent, so the frame check under the seal is what is tested
    (out / "meta.json").write_bytes(sealed_bytes(meta))
    with pytest.raises(CacheMismatchError, match=r"frames in its seek table, expected \d+ .*frame_tokens 2048"):
        _first_batch(out)
    meta["compression"] = {"codec": "lz4"}
    (out / "meta.json").write_bytes(sealed_bytes(meta))
    with pytest.raises(CacheError, match=r"compression \{'codec': 'lz4'\}"):
        _first_batch(out)


def test_build_command_compress_flag_and_its_refusals(tmp_path, tokenizer):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"document {i} about compressed shards" for i in range(300)))
    cli = [sys.executable, "-m", "niels_gpt.cli", "build", str(corpus), "--tokenizer", str(tokenizer.model_path),
           "--no-progress"]
    r = subprocess.run(cli + ["--out", str(tmp_path / "z"), "--compress", "zstd"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "z" / "train").iterdir()] == ["shard_00000.bin.zst"]
    r = subprocess.run(cli + ["--out", str(tmp_path / "chat"), "--compress", "zstd", "--chat"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "--compress apply to pretraining caches" in r.stderr
    with pytest.raises(ConfigError, match="frame_tokens=1000: a frame must hold a positive multiple of 2048"):
        ShardWriter(tmp_path / "w", np.dtype("<u2"), 1 << 20, compress="zstd", frame_tokens=1000)


def test_stats_of_a_compressed_cache_count_the_same_tokens_and_documents(pair, capsys):
    from niels_gpt.cache.cli import main

    out = []
    for cache in pair:
        assert main(["stats", str(cache), "--json"]) == 0
        out.append(json.loads(capsys.readouterr().out))
    strip = [[{k: v for k, v in s.items() if k != "path"} for s in o["streams"]] for o in out]
    assert strip[0] == strip[1] and out[1]["streams"][0]["tokens"] > 0
