"""A compressed cache (shards as zstd frames) converts and validates like any other: `convert` writes exactly the
output of converting the uncompressed cache of the same tokens, and `prepare-data` reports the same figures."""

from __future__ import annotations

import pytest

from niels_gpt.formats.convert import convert
from niels_gpt.formats.prepare import report

from .conftest import tokens_of

pytest.importorskip("zstandard")


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def compressed(real_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("zstd") / "z"
    convert(real_cache, out, to="niels", compress="zstd", shard_bytes=16_384)  # the shards of real_cache
    return out


@pytest.mark.parametrize("to", ["nanogpt", "kempner-npy", "megatron"])
def test_a_compressed_cache_converts_to_the_bytes_of_the_uncompressed_one(real_cache, compressed, tmp_path, to):
    convert(real_cache, tmp_path / "from-raw", to=to, max_tokens_per_file=8192)
    convert(compressed, tmp_path / "from-zstd", to=to, max_tokens_per_file=8192)
    assert _tree(tmp_path / "from-zstd") == _tree(tmp_path / "from-raw")


def test_a_compressed_cache_converts_back_to_its_tokens(real_cache, compressed, tmp_path):
    convert(compressed, tmp_path / "plain", to="niels", shard_bytes=16_384)
    assert tokens_of(tmp_path / "plain") == tokens_of(real_cache)
    assert sorted(p.name for p in (tmp_path / "plain" / "train").iterdir()) == \
        sorted(p.name for p in (real_cache / "train").iterdir())


def test_prepare_data_reads_a_compressed_cache(real_cache, compressed):
    raw, z = report(str(real_cache), seq_len=64), report(str(compressed), seq_len=64)
    for name in ("train", "val"):
        for key in ("files", "tokens", "samples", "max_id", "eot_count", "first_token", "last_token", "top_ids_share"):
            assert z["splits"][name][key] == raw["splits"][name][key], (name, key)
