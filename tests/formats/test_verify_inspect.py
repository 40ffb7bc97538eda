"""verify and inspect recognise every output the library writes and say truthfully what it is."""

from __future__ import annotations

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.formats.convert import convert
from niels_gpt.packing import pack_sft, write_packed_parquet
from niels_gpt.report import inspect_path, verify_outputs, verify_path

from ..conftest import SPECIALS, write_sft_cache

TARGETS = ["niels", "nanogpt", "nanogpt-legacy", "kempner-npy", "raw", "megatron"]


def _convert(src, dst, to):
    convert(src, dst, to=to, **({"not_for_kempnerforge": True} if to == "raw" else {}))
    return dst


@pytest.mark.parametrize("to", TARGETS)
def test_verify_passes_every_clean_convert_output_and_names_its_format(to, real_cache, tmp_path, capsys):
    out = _convert(real_cache, tmp_path / "out", to)
    problems, checked, seen = verify_outputs(str(out))
    assert problems == [] and checked == 1
    assert main(["verify", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "unfinished" not in printed and "0 problem(s)" in printed
    if to != "niels":
        assert f"{out}: {to} (uint16" in seen[0]


@pytest.mark.parametrize("to", ["nanogpt", "kempner-npy", "raw", "megatron"])
def test_verify_catches_an_id_outside_the_recorded_vocabulary(to, real_cache, tmp_path):
    out = _convert(real_cache, tmp_path / "out", to)
    token_file = next(f for f in sorted((out / "train").iterdir()) if f.suffix in (".bin", ".npy"))
    data = bytearray(token_file.read_bytes())
    data[-2:] = (65000).to_bytes(2, "little")  # the last token of the file: payload in every format
    token_file.write_bytes(bytes(data))
    problems, _ = verify_path(str(out))
    assert any("token id 65000 >= vocab_size 2004" in p for p in problems)
    assert any("sha256" in p and "differs from niels_receipt.json" in p for p in problems)


def test_verify_still_reports_our_unfinished_builds(real_cache, tmp_path):
    out = _convert(real_cache, tmp_path / "out", "niels")
    (out / "meta.json").unlink()
    problems, _ = verify_path(str(out))
    assert any("unfinished build" in p for p in problems)


@pytest.mark.parametrize("to", ["nanogpt", "kempner-npy", "megatron"])
def test_inspect_describes_a_foreign_output_and_decodes_with_a_tokenizer(to, real_cache, tokenizer, tmp_path):
    out = _convert(real_cache, tmp_path / "out", to)
    text = inspect_path(str(out), window=16)
    assert text.startswith(f"{to} output {out}") and "interrupted" not in text and "tokens: " in text
    ids = text.splitlines()[-1].split()
    assert len(ids) == 16 and all(i.isdigit() for i in ids)
    decoded = inspect_path(str(out), tokenizer=tokenizer.model_path, window=16)
    head = next(i for i, line in enumerate(decoded.splitlines()) if line.startswith("first 16 tokens"))
    assert "\n".join(decoded.splitlines()[head + 1:]) == tokenizer.decode([int(i) for i in ids])


@pytest.fixture
def packed(tmp_path):
    a, e = SPECIALS["asst"], SPECIALS["eot"]
    sft = write_sft_cache(tmp_path / "sft", [[SPECIALS["usr"], 7, 8, a, 9, 10, e]] * 5)
    pack_sft(str(sft), str(tmp_path / "packed"), pack_size=16)
    return tmp_path / "packed"


def test_verify_and_inspect_recognise_packed_bins(packed, capsys):
    assert verify_path(str(packed)) == ([], 1)
    text = inspect_path(str(packed), window=8)
    assert text.startswith(f"packed SFT bins {packed}") and "interrupted" not in text
    assert "pack_size: 16" in text and text.splitlines()[-1].split()[:3] == ["4", "7", "8"]


def test_verify_reads_packed_parquet(packed, tmp_path):
    from niels_gpt.packing import open_packed

    ds = open_packed(packed)
    out = tmp_path / "packed.parquet"
    write_packed_parquet([ds[i] for i in range(len(ds))], out)
    problems, checked, seen = verify_outputs(str(out))
    assert problems == [] and checked == 1 and "packed SFT Parquet" in seen[0]


@pytest.mark.parametrize("to", ["nanogpt", "nanogpt-legacy", "kempner-npy", "raw", "megatron"])
def test_every_converted_file_is_checksummed_and_verify_catches_any_change(to, real_cache, tmp_path):
    out = _convert(real_cache, tmp_path / "out", to)
    receipt = __import__("json").loads((out / "niels_receipt.json").read_text())
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.name != "niels_receipt.json" and p.is_file())
    assert sorted(receipt["files"]) == files and receipt["output_format"] == to
    yaml = out / "train" / "metadata.yaml"
    text = yaml.read_text()
    yaml.write_text(text.replace("eos_token_id: 6", "eos_token_id: 7"))  # an id a reader trusts
    problems, _ = verify_path(str(out))
    assert any("metadata.yaml: sha256" in p for p in problems), problems
    yaml.write_text(text)
    token_file = next(f for f in sorted((out / "train").iterdir()) if f.suffix in (".bin", ".npy"))
    data = bytearray(token_file.read_bytes())
    data[-1] ^= 0x01  # a payload byte inside the vocabulary
    token_file.write_bytes(bytes(data))
    assert any(token_file.name in p and "sha256" in p for p in verify_path(str(out))[0])
    data[-1] ^= 0x01
    token_file.write_bytes(bytes(data))
    (out / "val" / "extra.bin.tmp-1").write_bytes(b"x")
    problems, _ = verify_path(str(out))
    assert problems == [f"{out}/val/extra.bin.tmp-1: not listed in {out}/niels_receipt.json (a temporary file of a "
                        "killed run); remove it"]


def test_readers_refuse_a_converted_metadata_yaml_changed_after_convert(real_cache, tmp_path):
    from niels_gpt.cache.formats import detect_format
    from niels_gpt.errors import FormatError
    from niels_gpt.formats.kempner_dataset import MemoryMappedDataset

    out = _convert(real_cache, tmp_path / "out", "kempner-npy")
    yaml = out / "train" / "metadata.yaml"
    yaml.write_text(yaml.read_text().replace("eos_token_id: 6", "eos_token_id: 7"))
    with pytest.raises(FormatError, match="metadata.yaml: sha256 differs from .*niels_receipt.json"):
        detect_format(out)
    with pytest.raises(FormatError, match="metadata.yaml: sha256 differs"):
        MemoryMappedDataset(out / "train", 16, pack_sequences=True)
