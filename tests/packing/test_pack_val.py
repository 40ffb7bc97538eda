"""pack-sft packs the val split beside the train bins (OUT/val/), and verify, inspect, stats and the output
guard know it."""

import json

from niels_gpt.cli import main
from niels_gpt.packing import open_packed, pack_sft
from niels_gpt.report import cache_stats
from niels_gpt.report.verify import verify_path

from ..conftest import write_sft_cache
from .helpers import chats

ARRAYS = ("input_ids", "loss_mask", "packed_len", "seq_offsets", "seq_starts")


def _cache(tmp_path):
    return write_sft_cache(tmp_path / "sft", chats(120, seed=1), chats(17, seed=2))


def test_the_val_split_is_packed_into_val_and_equals_packing_it_alone(tmp_path):
    cache = _cache(tmp_path)
    m = pack_sft(cache, tmp_path / "p", pack_size=128, algorithm="bfd")
    assert m["val"]["num_sequences"] == 17 and m["num_sequences"] == 120
    alone = pack_sft(cache, tmp_path / "v", pack_size=128, algorithm="bfd", split="val")
    assert alone["val"] is None  # packing val itself packs nothing more
    for name in ARRAYS:
        assert (tmp_path / "p" / "val" / f"{name}.npy").read_bytes() == (tmp_path / "v" / f"{name}.npy").read_bytes()
    assert len(open_packed(tmp_path / "p" / "val")) == m["val"]["num_bins"]
    assert json.loads((tmp_path / "p" / "val" / "manifest.json").read_text())["source"]["split"] == "val"


def test_no_val_and_a_cache_without_val_examples_write_train_only(tmp_path):
    cache = _cache(tmp_path)
    assert pack_sft(cache, tmp_path / "p", pack_size=128, val=False)["val"] is None
    assert not (tmp_path / "p" / "val").exists()
    bare = write_sft_cache(tmp_path / "bare", chats(30, seed=1))
    assert pack_sft(bare, tmp_path / "q", pack_size=128)["val"] is None
    assert not (tmp_path / "q" / "val").exists()


def test_verify_stats_inspect_and_a_rerun_know_the_val_split(tmp_path, capsys):
    cache = _cache(tmp_path)
    out = tmp_path / "p"
    assert main(["pack-sft", str(cache), str(out), "--pack-size", "128"]) == 0
    assert "val: " in capsys.readouterr().out
    problems, checked = verify_path(str(out))
    assert problems == [] and checked == 2  # the train bins and the val bins, neither a stray of the other
    s = cache_stats(out)
    assert [st.name for st in s.streams] == ["bins", "val"] and s.streams[1].documents == 17
    assert main(["inspect", str(out)]) == 0
    assert "val: " in capsys.readouterr().out
    before = {p.name: p.read_bytes() for p in (out / "val").iterdir()}
    assert main(["pack-sft", str(cache), str(out), "--pack-size", "128"]) == 0  # its own output: replaced
    assert {p.name: p.read_bytes() for p in (out / "val").iterdir()} == before
    (out / "val" / "stray.npy").write_bytes(b"x")
    problems, _ = verify_path(str(out))
    assert any("stray.npy" in p for p in problems)
