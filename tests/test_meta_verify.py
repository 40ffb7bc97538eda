"""meta.json schema checks, sha256, and the verify/inspect commands."""

import hashlib
import json

import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta, sha256_file, write_meta
from niels_gpt.errors import CacheError, IncompleteCacheError


@pytest.fixture
def caches(tmp_path, tokenizer, real_docs):
    root = tmp_path / "cache"
    (root / "tokenizer").mkdir(parents=True)
    (root / "tokenizer" / "spm.model").write_bytes(open(tokenizer.model_path, "rb").read())
    write_meta(str(root / "tokenizer"), {"kind": "tokenizer", "tokenizer_sha256": tokenizer.sha256,
                                         "vocab_size": len(tokenizer), "special_token_ids": tokenizer.special_ids,
                                         "settings": {}})
    build_pretrain_cache(real_docs, str(root / "pretrain" / "p"), tokenizer=tokenizer, max_train_tokens=5000,
                         max_val_tokens=500, shard_bytes=4000, seed=0, shuffle_buffer=None)
    convs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in range(30)]
    build_sft_cache(convs, str(root / "sft" / "s"), tokenizer=tokenizer, val_frac=0.2, seed=0)
    return root


def test_contract_fields_are_present(caches):
    for sub, totals in (("pretrain/p", ("train_tokens", "val_tokens")), ("sft/s", ("train_examples", "val_examples"))):
        meta = read_meta(str(caches / sub))
        for key in ("dataset_name", "dataset_config", "split_rule", "seed", "token_dtype", "tokenizer_sha256",
                    "vocab_size", "special_token_ids", "files", "streaming", "build"):
            assert key in meta, key
        assert meta["token_dtype"] == "uint16-le"
        assert all(k in meta["totals"] for k in totals)
        for rel, rec in meta["files"].items():
            assert rec["sha256"] == sha256_file(str(caches / sub / rel))
    assert read_meta(str(caches / "pretrain/p"))["shard_bytes"] == 4000


def test_sha256_file_streams_the_same_digest(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 3_000_001)
    assert sha256_file(str(p)) == hashlib.sha256(b"x" * 3_000_001).hexdigest()


def test_read_meta_names_missing_fields(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"kind": "pretrain", "seed": 1, "totals": {}}))
    with pytest.raises(CacheError, match=r"missing field\(s\) dataset_name, .*totals.train_tokens"):
        read_meta(str(tmp_path))


def test_read_meta_rejects_bad_json_and_unknown_kind(tmp_path):
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(CacheError, match="not valid JSON"):
        read_meta(str(tmp_path))
    (tmp_path / "meta.json").write_text(json.dumps({"kind": "weird"}))
    with pytest.raises(CacheError, match="unknown kind 'weird'"):
        read_meta(str(tmp_path))


def test_missing_meta_is_reported_as_unfinished(tmp_path):
    with pytest.raises(IncompleteCacheError, match="build was interrupted"):
        read_meta(str(tmp_path))


def test_verify_passes_on_a_clean_cache(caches, capsys):
    assert main(["verify", str(caches)]) == 0
    assert "3 output(s), 0 problem(s)" in capsys.readouterr().out


def test_verify_catches_one_flipped_byte(caches, capsys):
    shard = caches / "pretrain/p/train/shard_00001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    assert main(["verify", str(caches)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "shard_00001.bin: sha256" in out and "shard_00000.bin" not in out


def test_verify_reports_truncation_and_unfinished_builds(caches, capsys):
    tok = caches / "sft/s/train_tokens.bin"
    tok.write_bytes(tok.read_bytes()[:-2])
    (caches / "sft/s2").mkdir()
    (caches / "sft/s2/train_tokens.bin").write_bytes(b"\0\0")
    assert main(["verify", str(caches)]) == 1
    out = capsys.readouterr().out
    assert "train_tokens.bin:" in out and "bytes on disk" in out
    assert "s2: token files but no meta.json (or manifest.json): unfinished build" in out


def test_inspect_shows_decoded_text_and_trained_span(caches, capsys):
    assert main(["inspect", str(caches / "pretrain/p")]) == 0
    out = capsys.readouterr().out
    assert "kind: pretrain" in out and "first 64 tokens of train/shard_00000.bin" in out
    assert main(["inspect", str(caches / "sft/s")]) == 0
    out = capsys.readouterr().out
    assert "<|usr|>" in out and "<|asst|>⟦" in out and "⟦<|eot|>⟧" in out


def test_inspect_of_a_cache_shorter_than_the_window_and_without_val_decodes_its_train_split(caches, real_docs,
                                                                                        tokenizer, capsys):
    """Train held no more tokens than the window, so inspect looked for a val split; with none it crashed in
    max() on no shards."""
    build_pretrain_cache(real_docs, str(caches / "pretrain" / "tiny"), tokenizer=tokenizer, max_train_tokens=40,
                         max_val_tokens=0, shard_bytes=4000, seed=0, shuffle_buffer=None)
    assert main(["inspect", str(caches / "pretrain" / "tiny")]) == 0
    assert "first 40 tokens of train/shard_00000.bin:" in capsys.readouterr().out


def test_cli_failure_is_one_line_and_nonzero(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "an empty directory, not a cache" in err and "\n" not in err


def test_verify_validates_packed_sft_directories(caches, tmp_path, capsys):
    import numpy as np

    from niels_gpt.packing import pack_sft

    packed = caches / "packed" / "s"
    pack_sft(str(caches / "sft/s"), str(packed), pack_size=64, algorithm="ffd")
    assert main(["verify", str(caches)]) == 0
    assert "5 output(s), 0 problem(s)" in capsys.readouterr().out  # the val split packed into packed/s/val too
    mask = np.load(packed / "loss_mask.npy", mmap_mode="r+")
    end = int(np.load(packed / "packed_len.npy")[0]) - 1
    mask[0, end] = 1  # a target across the bin's last sequence boundary
    mask.flush()
    del mask
    assert main(["verify", str(caches)]) == 1
    assert "loss_mask is 1 at a sequence's last position" in capsys.readouterr().out


def test_verify_reports_packed_arrays_without_manifest(caches, capsys):
    from niels_gpt.packing import pack_sft

    packed = caches / "packed" / "s"
    pack_sft(str(caches / "sft/s"), str(packed), pack_size=64, algorithm="ffd")
    (packed / "manifest.json").unlink()
    assert main(["verify", str(caches)]) == 1
    assert "packed/s: token files but no meta.json (or manifest.json): unfinished build" in capsys.readouterr().out


def test_verify_and_load_check_the_tokenizer_model_against_its_recorded_sha256(caches, capsys):
    import sentencepiece as spm

    from niels_gpt.errors import TokenizerError
    from niels_gpt.tokenizer import load_tokenizer

    model = caches / "tokenizer" / "spm.model"
    original = model.read_bytes()
    for pos in range(len(original) // 2, len(original)):  # the first flip that still loads (a piece's score)
        data = bytearray(original)
        data[pos] ^= 0x01
        try:
            spm.SentencePieceProcessor(model_proto=bytes(data))
            break
        except RuntimeError:
            continue
    model.write_bytes(bytes(data))
    assert main(["verify", str(caches)]) == 1
    assert "spm.model: sha256" in capsys.readouterr().out
    assert main(["verify", str(caches / "tokenizer")]) == 1
    with pytest.raises(TokenizerError, match="the model file was changed or damaged"):
        load_tokenizer(caches / "tokenizer")


def test_a_tokenizer_directory_whose_meta_was_withdrawn_is_refused(caches):
    from niels_gpt.errors import TokenizerError
    from niels_gpt.tokenizer import load_tokenizer

    (caches / "tokenizer" / "meta.json").unlink()
    with pytest.raises(TokenizerError, match="spm.model without meta.json: an interrupted train-tokenizer"):
        load_tokenizer(caches / "tokenizer")
    assert len(load_tokenizer(caches / "tokenizer" / "spm.model")) > 0  # the file itself, on purpose


def test_edited_special_ids_are_caught(caches):
    from niels_gpt.report import verify_path

    meta_file = caches / "sft" / "s" / "meta.json"
    clean = meta_file.read_text()
    meta = json.loads(clean)
    meta["special_token_ids"]["asst"] = 1000  # a plausible id: distinct, inside the vocabulary
    meta_file.write_text(json.dumps(meta))
    problems, _ = verify_path(str(caches))
    assert any("special_token_ids" in p and "the tokenizer it was built with has" in p for p in problems)
    meta["special_token_ids"]["asst"] = meta["special_token_ids"]["usr"]  # two specials on one id
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(CacheError, match="must be distinct ids below vocab_size"):
        read_meta(str(caches / "sft" / "s"))
    meta_file.write_text(clean)
    pmeta_file = caches / "pretrain" / "p" / "meta.json"
    pmeta = json.loads(pmeta_file.read_text())
    pmeta["document_separator"]["id"] = 1000
    pmeta_file.write_text(json.dumps(pmeta))
    with pytest.raises(CacheError, match=r"document_separator.id 1000 is not special_token_ids.eot"):
        read_meta(str(caches / "pretrain" / "p"))


def _resealed(cache, edit) -> None:
    """Edit meta.json and recompute its own seal, as a tool that rewrites it would."""
    from niels_gpt.seals import sealed_bytes

    meta = json.loads((cache / "meta.json").read_text())
    edit(meta)
    (cache / "meta.json").write_bytes(sealed_bytes(meta))


def test_verify_refuses_a_resealed_meta_that_the_readers_refuse(caches, tmp_path):
    """What verify passes every reader opens: an edit that keeps every file's record (and the seal) is still
    caught when the readers' own open-time checks refuse the cache."""
    from niels_gpt.cache.sft_dataset import SFTExampleDataset
    from niels_gpt.formats.convert import convert
    from niels_gpt.loading.windows import IndexedWindowDataset
    from niels_gpt.report import verify_path

    z = tmp_path / "z"
    convert(caches / "pretrain" / "p", z, to="niels", compress="zstd")
    assert verify_path(str(z)) == ([], 1)
    _resealed(z, lambda m: m.pop("compression"))
    with pytest.raises(CacheError):
        IndexedWindowDataset(str(z), 8)
    problems, _ = verify_path(str(z))
    assert len(problems) == 1 and "no `compression` entry" in problems[0]

    from .conftest import write_sft_cache

    sft = write_sft_cache(tmp_path / "sft", [[4, 10, 6, 5, 11, 6]] * 3)  # no tokenizer to compare its ids with
    assert verify_path(str(sft)) == ([], 1)
    _resealed(sft, lambda m: m["special_token_ids"].update(asst=None))  # no sentinel and no stored mask
    with pytest.raises(CacheError, match="no assistant sentinel"):
        SFTExampleDataset(str(sft / "train_tokens.bin"), str(sft / "train_idx.npy"), T=8, device="cpu",
                          eot_id=read_meta(str(sft))["special_token_ids"]["eot"])
    problems, _ = verify_path(str(sft))
    assert len(problems) == 1 and "no assistant sentinel" in problems[0]
