"""build-all end to end on the bundled sample corpus, and the CLI's failure modes."""

import hashlib
import json

import pytest

from niels_gpt.cache.cli import build_parser, main
from niels_gpt.cache.meta import read_meta


def _digests(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sample_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("a") / "cache"
    assert main(["build-all", "--cache-dir", str(root), "--sample", "--no-progress"]) == 0
    return root


def test_build_all_builds_every_cache_of_the_contract(sample_cache):
    for sub in ("pretrain/fineweb_edu", "pretrain/roam", "pretrain/wikitext", "pretrain/gutenberg"):
        meta = read_meta(str(sample_cache / sub))
        assert meta["kind"] == "pretrain" and meta["totals"]["train_tokens"] > 0 and meta["totals"]["val_tokens"] > 0
        assert list((sample_cache / sub / "train").glob("shard_*.bin"))
    for sub in ("sft/dolly15k", "sft/oasst1"):
        meta = read_meta(str(sample_cache / sub))
        assert meta["totals"]["train_examples"] > meta["totals"]["val_examples"] > 0
    web = read_meta(str(sample_cache / "pretrain/fineweb_edu"))  # the sample's local file: read, not streamed
    assert web["streaming"] is False and web["build"]["shuffle_buffer"] == 10_000  # the contract's buffer, torch RNG
    assert read_meta(str(sample_cache / "pretrain/fineweb_edu"))["totals"]["val_tokens"] == 4096
    tok = read_meta(str(sample_cache / "tokenizer"))
    assert tok["vocab_size"] == 16_004
    assert read_meta(str(sample_cache / "sft/oasst1"))["tokenizer_sha256"] == tok["tokenizer_sha256"]
    assert main(["verify", str(sample_cache)]) == 0


def test_build_all_is_byte_identical_across_runs(sample_cache, tmp_path):
    again = tmp_path / "cache"
    assert main(["build-all", "--cache-dir", str(again), "--sample", "--no-progress"]) == 0
    assert _digests(again) == _digests(sample_cache)


def test_only_builds_a_subset_with_a_copied_tokenizer(sample_cache, tmp_path):
    root = tmp_path / "c"
    rc = main(["build-all", "--cache-dir", str(root), "--sample", "--no-progress", "--only", "dolly15k",
               "--tokenizer", str(sample_cache / "tokenizer" / "spm.model")])
    assert rc == 0
    assert sorted(p.name for p in root.iterdir()) == ["sft", "tokenizer"]
    assert _digests(root / "sft") == {k: v for k, v in _digests(sample_cache / "sft").items() if k.startswith("dolly15k")}


def test_gutenberg_without_directory_is_not_built_and_does_not_fail(sample_cache, tmp_path):
    root = tmp_path / "c"
    rc = main(["build-all", "--cache-dir", str(root), "--only", "gutenberg", "--no-progress",
               "--tokenizer", str(sample_cache / "tokenizer")])
    assert rc == 0
    meta = json.loads((root / "pretrain/gutenberg/meta.json").read_text())
    assert meta["built"] is False and "gutenberg-dir" in meta["reason"]


def test_missing_roam_directory_fails_with_one_line(sample_cache, tmp_path, capsys):
    rc = main(["build-all", "--cache-dir", str(tmp_path / "c"), "--only", "roam", "--no-progress",
               "--tokenizer", str(sample_cache / "tokenizer")])
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: roam needs its export directory: pass --roam-dir DIR (or leave roam out with --only, or use --sample)"
    assert not (tmp_path / "c" / "pretrain" / "roam" / "meta.json").exists()


def test_unknown_only_name_is_rejected(tmp_path, capsys):
    assert main(["build-all", "--cache-dir", str(tmp_path), "--only", "fineweb", "--sample"]) == 1
    assert "unknown name(s) fineweb" in capsys.readouterr().err


def test_every_contract_constant_is_a_flag_with_its_default_in_help():
    sub = build_parser()._subparsers._group_actions[0].choices["build-all"]
    text = sub.format_help()
    for flag, default in (("--max-tokens", "200000000"), ("--shard-bytes", "134217728"),
                          ("--fineweb-config", "CC-MAIN-2024-10"), ("--fineweb-buffer-size", "10000"),
                          ("--val-frac", "0.1"), ("--seed", "42"), ("--vocab-size", "16000"),
                          ("--fineweb-dataset", "HuggingFaceFW/fineweb-edu")):
        assert flag in text and default in text, flag


def test_byte_size_flags_accept_units():
    args = build_parser().parse_args(["build-all", "--shard-bytes", "64MB", "--max-tokens", "1_000"])
    assert args.shard_bytes == 64 * 2**20 and args.max_train_tokens == 1000
