"""convert names formats after the programs that read them (and lists them in --help); prepare-data warns
when a file's contents do not look like tokens of the stated vocabulary and dtype, and never prints the
settings to train on such a file without that warning."""

from __future__ import annotations

import numpy as np
import pytest

from niels_gpt.cache.cli import build_parser, main
from niels_gpt.formats.convert import convert
from niels_gpt.formats.names import ALIASES, READERS

EOT = 6  # the EOT id of the hand-made caches (tests/formats/conftest.py)


def test_convert_help_lists_every_format_with_the_program_that_reads_it():
    sub = next(a for a in build_parser("x")._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    text = sub.choices["convert"].format_help()
    for fmt, reader in READERS.items():
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(fmt + " ") or ln.strip() == fmt
                    or f"(= {fmt})" in ln)
        assert reader in line, (fmt, line)
    # a format is listed by the name of the program that reads it, its own name beside it
    assert "automodel (= nanogpt)" in text and "modded-nanogpt (= nanogpt-legacy)" in text
    assert "nanogpt-train-bin" in text and "raw, one uint16 file per split" in text
    assert "raw (=" not in text  # a preset is not listed as an alias


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_writes_the_bytes_of_its_format(alias, small_cache, tmp_path, read_tokens, capsys):
    fmt = ALIASES[alias]
    assert main(["convert", str(small_cache), str(tmp_path / alias), "--to", alias]) == 0
    assert f"({fmt}, as {alias}, from niels); read by {READERS[fmt]}" in capsys.readouterr().out
    assert main(["convert", str(small_cache), str(tmp_path / fmt), "--to", fmt]) == 0
    assert _files(tmp_path / alias) == _files(tmp_path / fmt)
    assert read_tokens(tmp_path / alias) == read_tokens(small_cache)
    assert convert(small_cache, tmp_path / f"{alias}-py", to=alias)["to"] == fmt


def _files(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_raw_converts_an_ordinary_cache_as_its_preset_does(small_cache, tmp_path, read_tokens, capsys):
    # an ordinary uint16 cache: even token counts, which KempnerForge would misread; raw writes it and says so
    assert main(["convert", str(small_cache), str(tmp_path / "raw"), "--to", "raw"]) == 0
    captured = capsys.readouterr()
    assert "note:" in captured.err and "--to kempner-npy" in captured.err
    assert read_tokens(tmp_path / "raw") == read_tokens(small_cache)
    assert main(["convert", str(small_cache), str(tmp_path / "n"), "--to", "nanogpt-train-bin"]) == 0
    assert "note:" not in capsys.readouterr().err
    # the Python call applies the preset as the command line does: the same files
    convert(small_cache, tmp_path / "n-py", to="nanogpt-train-bin")
    assert _files(tmp_path / "n-py") == _files(tmp_path / "n")
    assert [p.name for p in sorted((tmp_path / "n-py" / "train").glob("*.bin"))] == ["shard_00000.bin"]


@pytest.mark.parametrize("to", ["nanogpt", "nanogpt-legacy", "kempner-npy", "raw", "megatron", "nanogpt-train-bin"])
@pytest.mark.parametrize("splits", [True, False])
def test_metadata_yaml_names_the_files_beside_it(to, splits, small_cache, tmp_path):
    src = small_cache
    if not splits:
        convert(small_cache, tmp_path / "flat", to="raw", not_for_kempnerforge=True)
        src = tmp_path / "flat" / "train"
    convert(src, tmp_path / "out", to=to, not_for_kempnerforge=True)
    yamls = sorted((tmp_path / "out").rglob("metadata.yaml"))
    assert yamls
    for y in yamls:
        fields = dict(line.strip().split(": ", 1) for line in y.read_text().splitlines()[1:])
        named = sorted(p.name for p in y.parent.glob(f"{fields['file_prefix']}*.{fields['file_extension']}"))
        token_files = sorted(p.name for p in y.parent.iterdir()
                             if p.suffix in (".bin", ".npy") and not p.name.endswith(".bos.idx"))
        assert named and named == token_files, (y, fields, token_files)


def test_nanogpt_train_bin_is_one_uint16_file_per_split(small_cache, tmp_path, capsys):
    assert main(["convert", str(small_cache), str(tmp_path / "n"), "--to", "nanogpt-train-bin"]) == 0
    out = capsys.readouterr().out
    train = tmp_path / "n" / "train" / "shard_00000.bin"
    assert f"nanoGPT: link {train} as <data_dir>/train.bin" in out
    assert np.fromfile(train, dtype=np.uint16).tolist() == [10, 11, 12, EOT, 13, 14, EOT, EOT, 15, EOT]
    assert sorted(p.name for p in (tmp_path / "n" / "train").iterdir()) == ["metadata.yaml", "shard_00000.bin"]


def test_nanogpt_train_bin_refuses_uint32_tokens(cache_maker, tmp_path, capsys):
    wide = cache_maker(tmp_path / "wide", {"train": [[70_000, 5, EOT]]}, dtype="uint32-le", vocab_size=70_001)
    assert main(["convert", str(wide), str(tmp_path / "n"), "--to", "nanogpt-train-bin"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "reads train.bin/val.bin as uint16" in err and "\n" not in err
    assert not (tmp_path / "n").exists()


def test_random_bytes_are_warned_about_before_any_training_advice(tmp_path, capsys):
    noise = tmp_path / "noise.bin"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 400_000, dtype=np.uint8).tobytes())
    assert main(["prepare-data", str(noise), "--dtype", "uint16"]) == 0
    out, err = capsys.readouterr()
    assert "these ids do not look like tokens of a uint16 vocabulary: the id histogram is flat" in err
    assert "ids reach 65,535, the top of uint16, with no vocabulary recorded" in err
    lines = out.splitlines()
    advice = next(i for i, ln in enumerate(lines) if "train on it with" in ln)
    assert lines[advice - 1].startswith(f"# WARNING: {noise}: these ids do not look like tokens")


def test_real_tokens_get_no_such_warning(tmp_path, capsys, tokenizer):
    from niels_gpt.cache.build_cache import build_pretrain_cache

    from ..conftest import sample_texts

    out = tmp_path / "c"
    build_pretrain_cache(sample_texts(), str(out), tokenizer=tokenizer, max_train_tokens=60_000, max_val_tokens=0,
                         shard_bytes=1 << 20, seed=0, shuffle_buffer=None)
    assert main(["prepare-data", str(out)]) == 0
    out_text, err = capsys.readouterr()
    assert "do not look like tokens" not in out_text + err


@pytest.mark.parametrize("dtype", ["uint16", "uint16-le", "<u2", np.uint16, np.dtype("<u2")])
def test_nanogpt_train_bin_takes_uint16_by_any_name_the_dtype_parser_takes(dtype, small_cache, tmp_path):
    # a uint32 cache narrowed to uint16 for nanoGPT's train.py: every spelling of uint16 that --dtype's parser
    # takes is uint16 (only the string "uint16" was)
    src = tmp_path / "wide"
    convert(small_cache, src, to="niels", dtype="uint32")
    out = convert(src, tmp_path / "n", to="nanogpt-train-bin", dtype=dtype)
    assert {s["dtype"] for s in out["splits"].values()} == {"uint16"}
