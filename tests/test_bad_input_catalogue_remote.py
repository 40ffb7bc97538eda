"""Bad-input catalogue: compressed shards and training from a cache URL (--compress, --local-cache,
--cache-limit, --sampling shards, --shards-at-once). Each case is checked by check_case (one error line
naming what, where and how to fix it; nothing complete-looking left behind)."""

from __future__ import annotations

import json

import pytest

from niels_gpt.formats.convert import convert

from .test_bad_input_catalogue import Case, _copy, _edit_meta, check_case, world  # noqa: F401  (world: a fixture)

pytest.importorskip("zstandard")

SMALL = ["--depth", "1", "--n-embd", "32", "--n-head", "2", "--sequence-len", "32", "--device-batch-size", "2",
         "--steps", "2", "--eval-steps", "1"]


def _compressed(w, tmp):
    out = tmp / "zst"
    convert(w.pretrain, out, to="niels", compress="zstd", shard_bytes=8192)
    return out


def _corpus(tmp):
    path = tmp / "in" / "c.txt"
    path.parent.mkdir(parents=True)
    path.write_text("\n\n".join(f"document {i} about storage" for i in range(50)))
    return path


def build_unknown_codec(w, tmp):
    return ["build", str(_corpus(tmp)), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--compress", "lz4"]


def build_compress_chat(w, tmp):
    return ["build", str(_corpus(tmp)), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--chat",
            "--compress", "zstd", "--no-progress"]


def convert_compress_peer_format(w, tmp):
    return ["convert", str(w.pretrain), str(tmp / "conv"), "--to", "nanogpt", "--compress", "zstd"]


def verify_edited_frame_count(w, tmp):
    c = _compressed(w, tmp)
    _edit_meta(c, lambda m: m["files"]["train/shard_00000.bin.zst"].update(
        frames=m["files"]["train/shard_00000.bin.zst"]["frames"] + 1))
    return ["verify", str(c)]


def train_damaged_frame(w, tmp):
    c = _compressed(w, tmp)
    shard = c / "train" / "shard_00000.bin.zst"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x20  # inside frame 0
    shard.write_bytes(bytes(data))
    meta = json.loads((c / "meta.json").read_text())
    assert meta["files"]["train/shard_00000.bin.zst"]["frames"] >= 1
    return ["train", str(c), "--out-dir", str(tmp / "run"), "--data-kind", "indexed", "--tokenizer",
            str(w.tokenizer), *SMALL]


def train_cache_limit_not_a_size(w, tmp):
    return ["train", "s3://bucket/cache", "--out-dir", str(tmp / "run"), "--cache-limit", "banana", *SMALL]


def train_shards_at_once_zero(w, tmp):
    return ["train", str(w.pretrain), "--out-dir", str(tmp / "run"), "--sampling", "shards", "--shards-at-once", "0",
            *SMALL]


def train_unsupported_scheme(w, tmp):
    return ["train", "ftp://example.invalid/cache", "--out-dir", str(tmp / "run"), *SMALL]


def train_url_without_a_cache(w, tmp):
    return ["train", "memory://no-such-bucket/cache", "--out-dir", str(tmp / "run"), "--local-cache",
            str(tmp / "downloads"), *SMALL]


CASES = [
    Case("build: unknown --compress codec", build_unknown_codec, ("--compress", "invalid choice", "zstd"), status=2,
         out="out"),
    Case("build: --compress with --chat", build_compress_chat, ("--compress", "pretraining caches", "--chat"),
         out="out"),
    Case("convert: --compress to a peer format", convert_compress_peer_format, ("--compress", "--to niels", "nanogpt"),
         out="conv", reads=("pretrain",)),
    Case("verify: edited frame count of a compressed shard", verify_edited_frame_count,
         ("shard_00000.bin.zst", "frames in its seek table", "meta.json records"), report=True),
    Case("train: a damaged frame of a compressed shard", train_damaged_frame,
         ("shard_00000.bin.zst", "frame 0", "rebuild the cache")),
    Case("train: --cache-limit that is not a size", train_cache_limit_not_a_size, ("--cache-limit", "banana", "20GB")),
    Case("train: --shards-at-once 0", train_shards_at_once_zero, ("shards_at_once=0", "positive int"),
         reads=("pretrain",)),
    Case("train: unsupported URL scheme", train_unsupported_scheme, ("ftp", "not supported", "s3://")),
    Case("train: a URL without a cache", train_url_without_a_cache, ("memory://no-such-bucket/cache", "meta.json",
                                                                     "upload")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line(case, world, tmp_path, capsys):  # noqa: F811  (world: the fixture)
    check_case(case, world, tmp_path, capsys)
