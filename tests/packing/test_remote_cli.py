"""Write-local-then-upload through fsspec (memory and local filesystems) and the pack-sft command."""

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.packing import PackedMemmapDataset, pack_sft

from ..conftest import write_sft_cache
from .helpers import chats

NAMES = ["examples.npy", "input_ids.npy", "loss_mask.npy", "packed_len.npy", "seq_offsets.npy", "seq_starts.npy"]


@pytest.fixture
def cache(tmp_path):
    return write_sft_cache(tmp_path / "c", chats(40, seed=6))


def test_pack_to_memory_filesystem_uploads_every_file_manifest_last(tmp_path, cache):
    fsspec = pytest.importorskip("fsspec")  # the `cloud` extra
    url = "memory://packing-test/run1"
    m = pack_sft(cache, url, pack_size=128)
    local = pack_sft(cache, tmp_path / "local", pack_size=128)
    fs = fsspec.filesystem("memory")
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("/packing-test/run1", detail=False)) == sorted(NAMES + ["manifest.json"])
    for name in NAMES + ["manifest.json"]:
        assert fs.cat_file(f"/packing-test/run1/{name}") == (tmp_path / "local" / name).read_bytes()
    assert m == local
    fs.rm("/packing-test", recursive=True)


def test_file_url_is_written_in_place(tmp_path, cache):
    pack_sft(cache, f"file://{tmp_path}/direct", pack_size=128)
    assert len(PackedMemmapDataset(tmp_path / "direct")) > 0


def test_cli_packs_and_prints_a_summary(tmp_path, cache, capsys):
    rc = main(["pack-sft", str(cache), str(tmp_path / "p"), "--pack-size", "128", "--algorithm", "bfd"])
    out = capsys.readouterr().out
    m = PackedMemmapDataset(tmp_path / "p").manifest
    assert rc == 0
    assert "seq_len=128 algorithm=bfd on_overflow=truncate seed=42" in out
    assert (f"pack-sft: {m['num_bins']} bins, 40 sequences, {m['num_tokens']} tokens, "
            f"efficiency {m['efficiency']:.4f}, truncated 0") in out


def test_package_cli_registers_pack_sft(tmp_path, cache, capsys):
    rc = main(["pack-sft", str(cache), str(tmp_path / "p"), "--pack-size", "16", "--on-overflow", "reject"])
    err = capsys.readouterr().err
    assert rc == 1 and "more than pack_size=16" in err and "--on-overflow truncate" in err
    assert not (tmp_path / "p" / "manifest.json").exists()
