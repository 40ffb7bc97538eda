"""Bad-input catalogue, writers and readers of finished outputs: a lock left empty by an older version, caches
whose commit marker is gone (stats says unfinished), a resealed meta.json that no reader opens (verify says so),
a convert over an output of another kind, convert and prepare-data of packed bins, --on-overflow split of a cache without role sentinels."""

from __future__ import annotations

import json

import pytest

from .test_bad_input_catalogue import (  # noqa: F401  (world: the fixture)
    Case,
    _copy,
    check_case,
    world,
)


def _without_meta(w, tmp):
    c = _copy(w.pretrain, tmp / "c")
    (c / "meta.json").unlink()
    return c


def stats_cache_without_meta(w, tmp):
    return ["stats", str(_without_meta(w, tmp))]


def stats_split_of_a_cache_without_meta(w, tmp):
    return ["stats", str(_without_meta(w, tmp) / "train")]


def stats_sft_cache_without_meta(w, tmp):
    c = _copy(w.sft, tmp / "s")
    (c / "meta.json").unlink()
    return ["stats", str(c)]


def _mixture(w, tmp, phases) -> list[str]:
    (tmp / "mix.json").write_text(json.dumps({"datasets": {"web": str(w.pretrain), "wiki": str(w.pretrain)},
                                              "phases": phases}))
    return ["stats", str(tmp / "mix.json"), "--steps", "5"]


def stats_mixture_whose_first_phase_starts_late(w, tmp):
    return _mixture(w, tmp, [{"start_step": 3, "weights": {"web": 1}}])  # an IndexError at step 0


def stats_mixture_weighing_an_unknown_dataset(w, tmp):
    return _mixture(w, tmp, [{"start_step": 0, "weights": {"web": 1, "books": 1}}])  # books was left out silently


def inspect_window_zero(w, tmp):
    return ["inspect", str(w.pretrain), "--window", "0"]  # decoded 2 tokens


def inspect_window_negative_of_an_sft_cache(w, tmp):
    return ["inspect", str(w.sft), "--window", "-5"]  # "SFTExampleDataset: T=-5 is not a window length"


def pack_sft_over_an_empty_lock(w, tmp):
    tmp.joinpath("p.lock").write_bytes(b"")  # what an older version left when killed as it took the lock
    return ["pack-sft", str(w.sft), str(tmp / "p"), "--pack-size", "128"]


def verify_compressed_cache_without_its_compression_entry(w, tmp):
    pytest.importorskip("zstandard")
    from niels_gpt.formats.convert import convert
    from niels_gpt.seals import sealed_bytes

    z = tmp / "z"
    convert(w.pretrain, z, to="niels", compress="zstd")
    meta = json.loads((z / "meta.json").read_text())
    del meta["compression"]
    (z / "meta.json").write_bytes(sealed_bytes(meta))  # resealed: its own checksum holds
    return ["verify", str(z)]


def convert_over_a_packed_directory(w, tmp):
    from niels_gpt.packing import pack_sft

    pack_sft(w.sft, tmp / "p", pack_size=128)
    return ["convert", str(w.pretrain), str(tmp / "p"), "--to", "raw", "--not-for-kempnerforge"]


def _packed_with_val(w, tmp):
    from niels_gpt.packing import pack_sft

    pack_sft(w.sft, tmp / "p", pack_size=128)
    return tmp / "p"


def convert_packed_bins(w, tmp):
    return ["convert", str(_packed_with_val(w, tmp)), str(tmp / "c"), "--to", "niels"]


def prepare_data_of_packed_val_bins(w, tmp):
    return ["prepare-data", str(_packed_with_val(w, tmp) / "val")]


def pack_sft_split_a_template_cache(w, tmp):
    from .packing.test_split_overflow import conversation, template_cache

    return ["pack-sft", str(template_cache(tmp)), str(tmp / "p"), "--pack-size", str(len(conversation(1, 9)) - 1),
            "--on-overflow", "split"]


CASES = [
    Case("stats: a cache whose meta.json is gone", stats_cache_without_meta,
         ("/c:", "token files but no meta.json", "unfinished build", "build again"), reads=("pretrain",)),
    Case("stats: a split of a cache whose meta.json is gone", stats_split_of_a_cache_without_meta,
         ("/c/train:", "no meta.json", "unfinished build")),
    Case("stats: an SFT cache whose meta.json is gone", stats_sft_cache_without_meta,
         ("/s:", "no meta.json", "unfinished build")),
    Case("stats: a mixture whose first phase starts after step 0", stats_mixture_whose_first_phase_starts_late,
         ("mix.json", "phase start steps [3]", "the first must be 0")),
    Case("stats: a mixture weighing a dataset it does not have", stats_mixture_weighing_an_unknown_dataset,
         ("mix.json", "unknown dataset(s) ['books']", "the mixture has")),
    Case("inspect: --window 0", inspect_window_zero, ("--window 0", "must be >= 1")),
    Case("inspect: --window -5 of an SFT cache", inspect_window_negative_of_an_sft_cache, ("--window -5", "must be >= 1")),
    Case("pack-sft: an empty lock beside OUT", pack_sft_over_an_empty_lock,
         ("p.lock", "names no build", "remove the lock file"), out="p", reads=("sft",)),
    Case("verify: a compressed cache's compression entry removed and resealed",
         verify_compressed_cache_without_its_compression_entry, ("meta.json", "no `compression` entry", "rebuild"),
         report=True),
    Case("convert: DST holds packed bins", convert_over_a_packed_directory,
         ("DST", "/p:", "packed SFT bins", "not a converted corpus", "choose another DST"), reads=("pretrain",)),
    Case("convert: SRC is packed SFT bins", convert_packed_bins,
         ("/p:", "packed SFT bins", "not a token stream", "pass the SFT cache"), out="c"),
    Case("prepare-data: packed val bins", prepare_data_of_packed_val_bins,
         ("/p/val:", "packed SFT bins", "not a token stream", "pass the SFT cache")),
    Case("pack-sft --on-overflow split: a cache without role sentinels", pack_sft_split_a_template_cache,
         ("/c/meta.json:", "--on-overflow split", "no role sentinel ids", "truncate or reject"), out="p"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_one_clear_line_and_no_complete_looking_output(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
