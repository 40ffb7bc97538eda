"""The bad-input catalogue: one case per class of bad input a user can hand the CLI.

Each case builds its bad input in a scratch directory, runs the command in this process through
`niels_gpt.cache.cli.main`, and checks three things: the exit status is an error (1 for the package's
errors, 2 for a flag that argparse refuses), stderr ends in exactly one `error: ...` line that contains
the case's key phrases (what was wrong, where, and how to fix it), and no output looks complete: the
output it was asked to write has no commit marker (meta.json / manifest.json / metadata.yaml) and every
input it read is byte-for-byte unchanged.

The catalogue's size is itself a figure of the reliability note (docs/architecture.md, "Reliability").
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.cli import main
from niels_gpt.tokenizer import TrainSettings, train_tokenizer

from .conftest import sample_texts

MARKERS = ("meta.json", "manifest.json", "metadata.yaml")
CONVERSATIONS = [
    [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"},
     {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]
    for i in range(40)
]


@dataclass
class World:
    """Inputs shared by every case, built once: a tokenizer and one cache of each kind."""

    root: Path
    tokenizer: Path  # the model file
    pretrain: Path
    sft: Path
    other_tokenizer: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer) -> World:
    root = tmp_path_factory.mktemp("catalogue")
    pre = root / "cache" / "pretrain" / "docs"
    build_pretrain_cache([t for t in sample_texts() if t.strip()], str(pre), tokenizer=tokenizer,
                         max_train_tokens=20_000, max_val_tokens=2_000, seed=0, shuffle_buffer=None,
                         progress=False, num_workers=1, shard_bytes=8192)
    sft = root / "cache" / "sft" / "chat"
    build_sft_cache(CONVERSATIONS, str(sft), tokenizer=tokenizer, val_frac=0.1, seed=0)
    other = train_tokenizer(sample_texts()[::-1], root / "other",
                            settings=TrainSettings(vocab_size=2000, model_type="unigram"))  # not the default
    return World(root, Path(tokenizer.model_path), pre, sft, Path(other.model_path))


@dataclass
class Case:
    name: str
    make: Callable[[World, Path], list[str]]  # writes the bad input under tmp, returns argv
    expect: tuple[str, ...]  # phrases the one error line contains (case-insensitive)
    status: int = 1
    out: str | None = None  # output (relative to tmp) that must not look complete
    needs: str | None = None  # "tmpfs": skipped where a tmpfs cannot be mounted
    reads: tuple[str, ...] = field(default=())  # World inputs that must stay unchanged
    report: bool = False  # `verify`: problems are its report on stdout, one MISMATCH line each


def _jsonl(path: Path, lines: list[str | bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines)
    path.write_bytes(data)
    return path


def _good_rows(n: int = 30) -> list[str]:
    return [json.dumps({"text": t}) for t in sample_texts()[:n] if t.strip()]


def _fineweb(w: World, tmp: Path, data: Path, *extra: str) -> list[str]:
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "fineweb_edu",
            "--fineweb-data-files", str(data), "--max-train-tokens", "5000", "--max-val-tokens", "500",
            "--no-progress", *extra]


def _dolly(w: World, tmp: Path, data: Path) -> list[str]:
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "dolly15k",
            "--dolly-data-files", str(data), "--no-progress"]


def _oasst_trees(w: World, tmp: Path, data: Path) -> list[str]:
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "oasst1",
            "--oasst-trees-jsonl", str(data), "--no-progress"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_meta(cache: Path, edit: Callable[[dict], None]) -> None:
    meta = json.loads((cache / "meta.json").read_text())
    edit(meta)
    (cache / "meta.json").write_text(json.dumps(meta, indent=2))


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")


# ---------------------------------------------------------------------------------------------- cases

def malformed_jsonl_line(w, tmp):
    rows = _good_rows(5)
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "bad.jsonl", [rows[0], '{"text": "unterminated', *rows[1:]]))


def empty_local_jsonl(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "empty.jsonl", []))


def cp1252_bytes(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "cp.jsonl", [*_good_rows(3), b'{"text": "caf\xe9 \x93quoted\x94"}']))


def lone_surrogate(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "sur.jsonl", [*_good_rows(3), '{"text": "half a pair \\ud800 here"}']))


def missing_data_file(w, tmp):
    return _fineweb(w, tmp, tmp / "in" / "nowhere.jsonl")


def only_empty_documents(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "blank.jsonl", ['{"text": ""}', '{"text": "   "}', '{"text": null}']))


def json_array_not_jsonl(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "array.jsonl", ["[1, 2, 3]"]))


def gzip_truncated(w, tmp):
    data = gzip.compress("\n".join(_good_rows(20)).encode())
    p = tmp / "in" / "cut.jsonl.gz"
    p.parent.mkdir(parents=True)
    p.write_bytes(data[: len(data) // 2])
    return _fineweb(w, tmp, p)


def budgets_zero(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()), "--max-tokens", "0",
                    "--val-tokens", "0")


def negative_budget(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()), "--max-tokens", "-5")


def tiny_shard_bytes(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()), "--shard-bytes", "2")


def seed_above_torch_range(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()), "--seed", str(2**64))


def seed_negative(w, tmp):
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()), "--seed", "-1")


def cache_dir_is_a_file(w, tmp):
    (tmp / "out").write_text("not a directory\n")
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()))


def read_only_output(w, tmp):
    _mount_tmpfs(tmp / "out", "ro,size=1m")
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()))


def full_disk(w, tmp):
    _mount_tmpfs(tmp / "out", "size=256k")
    rows = [json.dumps({"text": t}) for t in sample_texts() if t.strip()] * 4
    return _fineweb(w, tmp, _jsonl(tmp / "in" / "big.jsonl", rows), "--max-train-tokens", "2000000",
                    "--max-val-tokens", "1000")


def tokenizer_missing(w, tmp):
    argv = _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()))
    argv[argv.index("--tokenizer") + 1] = str(tmp / "no" / "spm.model")
    return argv


def tokenizer_not_a_model(w, tmp):
    argv = _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()))
    bad = tmp / "garbage.model"
    bad.write_bytes(b"\x00\x01 this is no sentencepiece model " * 10)
    argv[argv.index("--tokenizer") + 1] = str(bad)
    return argv


def tokenizer_dir_without_model(w, tmp):
    argv = _fineweb(w, tmp, _jsonl(tmp / "in" / "ok.jsonl", _good_rows()))
    (tmp / "emptytok").mkdir()
    argv[argv.index("--tokenizer") + 1] = str(tmp / "emptytok")
    return argv


def tokenizer_replaced_under_caches(w, tmp):
    out = tmp / "out"
    _copy(w.root / "cache" / "pretrain", out / "pretrain")
    (out / "tokenizer").mkdir()
    shutil.copy(w.tokenizer, out / "tokenizer" / "spm.model")
    shutil.copy(w.tokenizer.parent / "meta.json", out / "tokenizer" / "meta.json")
    return ["build-all", "--cache-dir", str(out), "--tokenizer", str(w.other_tokenizer), "--only", "tokenizer",
            "--no-progress"]


def unknown_only_name(w, tmp):
    return ["build-all", "--cache-dir", str(tmp / "out"), "--only", "fineweb", "--no-progress"]


def val_frac_out_of_range(w, tmp):
    argv = _dolly(w, tmp, _jsonl(tmp / "in" / "d.jsonl", ['{"instruction": "a", "context": "", "response": "b"}']))
    return [*argv, "--val-frac", "1.5"]


def dolly_without_instruction(w, tmp):
    return _dolly(w, tmp, _jsonl(tmp / "in" / "d.jsonl", ['{"context": "c", "response": "r"}'] * 3))


def dolly_non_string_response(w, tmp):
    return _dolly(w, tmp, _jsonl(tmp / "in" / "d.jsonl", ['{"instruction": "a", "context": "", "response": 7}']))


def oasst_non_string_text(w, tmp):
    tree = {"message_id": "r", "role": "prompter", "text": "hello?", "replies": [
        {"message_id": "a", "role": "assistant", "text": {"en": "hi"}, "replies": []}]}
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "t.jsonl", [json.dumps(tree)]))


def oasst_unknown_shape(w, tmp):
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "t.jsonl", [json.dumps({"conversation": ["a", "b"]})]))


def oasst_malformed_line(w, tmp):
    good = {"message_id": "r", "role": "prompter", "text": "q", "replies": [
        {"message_id": "a", "role": "assistant", "text": "a", "replies": []}]}
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "t.jsonl", [json.dumps(good), "{not json"]))


def oasst_replies_not_a_list(w, tmp):
    tree = {"message_id": "r", "role": "prompter", "text": "q", "replies": "none"}
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "t.jsonl", [json.dumps(tree)]))


def roam_dir_missing(w, tmp):
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "roam",
            "--roam-dir", str(tmp / "no-such-export"), "--no-progress"]


def inspect_not_a_cache(w, tmp):
    (tmp / "plain").mkdir()
    (tmp / "plain" / "notes.txt").write_text("hello\n")
    return ["inspect", str(tmp / "plain")]


def inspect_meta_not_json(w, tmp):
    c = _copy(w.pretrain, tmp / "c")
    (c / "meta.json").write_text('{"kind": "pretrain", ')
    return ["inspect", str(c)]


def inspect_other_tokenizer(w, tmp):
    return ["inspect", str(w.pretrain), "--tokenizer", str(w.other_tokenizer)]


def verify_stray_shard(w, tmp):
    c = _copy(w.pretrain, tmp / "c")
    shutil.copy(c / "train" / "shard_00000.bin", c / "train" / "shard_00099.bin")
    return ["verify", str(c)]


def _first_shard(meta: dict) -> dict:
    return meta["files"]["train/shard_00000.bin"]


def verify_edited_token_count(w, tmp):
    c = _copy(w.pretrain, tmp / "c")
    _edit_meta(c, lambda m: _first_shard(m).update(tokens=_first_shard(m)["tokens"] + 1))
    return ["verify", str(c)]


def verify_renamed_record_key(w, tmp):
    c = _copy(w.pretrain, tmp / "c")
    _edit_meta(c, lambda m: _first_shard(m).update(digest=_first_shard(m).pop("sha256")))
    return ["verify", str(c)]


def verify_float_index(w, tmp):
    c = _copy(w.sft, tmp / "c")
    np.save(c / "train_idx.npy", np.load(c / "train_idx.npy").astype(np.float64))
    return ["verify", str(c)]


def pack_sft_pickled_index(w, tmp):
    c = _copy(w.sft, tmp / "c")
    np.save(c / "train_idx.npy", np.array([0, 5, "x"], dtype=object), allow_pickle=True)
    return ["pack-sft", str(c), str(tmp / "packed"), "--pack-size", "128"]


def pack_sft_flipped_index(w, tmp):
    c = _copy(w.sft, tmp / "c")
    idx = np.load(c / "train_idx.npy")
    idx[3] += 1
    np.save(c / "train_idx.npy", idx)
    return ["pack-sft", str(c), str(tmp / "packed"), "--pack-size", "128"]


def pack_sft_on_pretrain(w, tmp):
    return ["pack-sft", str(w.pretrain), str(tmp / "packed"), "--pack-size", "128"]


def pack_sft_pack_size_zero(w, tmp):
    return ["pack-sft", str(w.sft), str(tmp / "packed"), "--pack-size", "0"]


def pack_sft_seed_out_of_range(w, tmp):
    return ["pack-sft", str(w.sft), str(tmp / "packed"), "--seed", str(2**63)]


def pack_sft_into_file(w, tmp):
    (tmp / "packed").write_text("a file\n")
    return ["pack-sft", str(w.sft), str(tmp / "packed"), "--pack-size", "128"]


def convert_onto_existing(w, tmp):
    (tmp / "dst").mkdir()
    (tmp / "dst" / "keep.txt").write_text("mine\n")
    return ["convert", str(w.pretrain), str(tmp / "dst"), "--to", "nanogpt"]


def convert_not_a_corpus(w, tmp):
    (tmp / "src").mkdir()
    (tmp / "src" / "notes.txt").write_text("hello\n")
    return ["convert", str(tmp / "src"), str(tmp / "dst"), "--to", "nanogpt"]


def convert_tiny_shards(w, tmp):
    return ["convert", str(w.pretrain), str(tmp / "dst"), "--to", "niels", "--shard-bytes", "2"]


def convert_unknown_format(w, tmp):
    return ["convert", str(w.pretrain), str(tmp / "dst"), "--to", "parquet"]


def prepare_data_yaml_not_utf8(w, tmp):
    d = tmp / "kf"
    assert main(["convert", str(w.pretrain), str(d), "--to", "kempner-npy"]) == 0
    y = next(d.rglob("metadata.yaml"))
    y.write_bytes(y.read_bytes().replace(b"\n", b" \xff\n", 1))
    return ["prepare-data", str(d)]


def build_on_processes_missing_input(w, tmp):
    return ["build", str(tmp / "nowhere.jsonl"), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer),
            "--workers", "1", "--executor", "processes", "--no-progress"]


def build_on_processes_bad_line(w, tmp):
    data = _jsonl(tmp / "in" / "bad.jsonl", [*_good_rows(4), "{oops"])
    return ["build", str(data), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer),
            "--workers", "1", "--executor", "processes", "--no-progress"]


def train_on_not_a_cache(w, tmp):
    (tmp / "empty").mkdir()
    return ["train", str(tmp / "empty"), "--steps", "1", "--out", str(tmp / "run")]


CASES = [
    Case("malformed JSONL line", malformed_jsonl_line, ("bad.jsonl", "line 2"), out="out/pretrain"),
    Case("empty local JSONL", empty_local_jsonl, ("empty.jsonl", "empty"), out="out/pretrain"),
    Case("cp1252 bytes in UTF-8 input", cp1252_bytes, ("cp.jsonl", "cp1252"), out="out/pretrain"),
    Case("lone surrogate escape", lone_surrogate, ("sur.jsonl", "surrogate"), out="out/pretrain"),
    Case("missing data file", missing_data_file, ("nowhere.jsonl",), out="out/pretrain"),
    Case("only empty documents", only_empty_documents, ("blank.jsonl", "empty"), out="out/pretrain"),
    Case("JSON array instead of JSONL objects", json_array_not_jsonl, ("array.jsonl",), out="out/pretrain"),
    Case("truncated gzip", gzip_truncated, ("cut.jsonl.gz",), out="out/pretrain"),
    Case("budgets 0/0", budgets_zero, ("both 0", "--max-tokens"), out="out/pretrain"),
    Case("negative budget", negative_budget, ("--max-tokens -5", ">= 0"), out="out/pretrain"),
    Case("shard size below the minimum", tiny_shard_bytes, ("shard",), out="out/pretrain"),
    Case("seed above torch's range", seed_above_torch_range, ("--seed", "2**63"), status=2),
    Case("negative seed", seed_negative, ("--seed",), status=2),
    Case("--cache-dir is a file", cache_dir_is_a_file, ("out", "not a directory")),
    Case("read-only output", read_only_output, ("out", "read-only"), needs="tmpfs"),
    Case("full disk", full_disk, ("no space left", "needed more than", "token budgets"), out="out/pretrain", needs="tmpfs"),
    Case("tokenizer file missing", tokenizer_missing, ("spm.model",), out="out/tokenizer"),
    Case("tokenizer file not a model", tokenizer_not_a_model, ("garbage.model",), out="out/tokenizer"),
    Case("tokenizer directory without a model", tokenizer_dir_without_model, ("emptytok", "spm.model")),
    Case("tokenizer replaced under existing caches", tokenizer_replaced_under_caches,
         ("differs", "--replace-tokenizer")),
    Case("unknown --only name", unknown_only_name, ("--only", "fineweb", "choose from")),
    Case("val fraction out of range", val_frac_out_of_range, ("val_frac",), out="out/sft"),
    Case("dolly row without instruction", dolly_without_instruction, ("d.jsonl", "instruction"), out="out/sft"),
    Case("dolly non-string response", dolly_non_string_response, ("d.jsonl", "response"), out="out/sft"),
    Case("oasst non-string text", oasst_non_string_text, ("t.jsonl", "text"), out="out/sft"),
    Case("oasst unknown shape", oasst_unknown_shape, ("t.jsonl", "conversation"), out="out/sft"),
    Case("oasst malformed line", oasst_malformed_line, ("t.jsonl", "line 2"), out="out/sft"),
    Case("oasst replies not a list", oasst_replies_not_a_list, ("t.jsonl", "replies"), out="out/sft"),
    Case("roam export directory missing", roam_dir_missing, ("no-such-export",), out="out/pretrain"),
    Case("inspect: not a cache", inspect_not_a_cache, ("plain",)),
    Case("inspect: meta.json not JSON", inspect_meta_not_json, ("meta.json",)),
    Case("inspect: another tokenizer", inspect_other_tokenizer, ("sha256", "tokenizer"), reads=("pretrain",)),
    Case("verify: stray shard", verify_stray_shard, ("shard_00099.bin",), report=True),
    Case("verify: edited token count", verify_edited_token_count, ("tokens",), report=True),
    Case("verify: renamed per-file key", verify_renamed_record_key, ("sha256",), report=True),
    Case("verify: float64 index", verify_float_index, ("train_idx.npy", "sha256"), report=True),
    Case("pack-sft: pickled index", pack_sft_pickled_index, ("train_idx.npy",), out="packed"),
    Case("pack-sft: index changed after the build", pack_sft_flipped_index, ("train_idx.npy", "sha256"), out="packed"),
    Case("pack-sft: a pretraining cache", pack_sft_on_pretrain, ("sft",), out="packed", reads=("pretrain",)),
    Case("pack-sft: pack size 0", pack_sft_pack_size_zero, ("pack",), out="packed", reads=("sft",)),
    Case("pack-sft: seed out of range", pack_sft_seed_out_of_range, ("--seed",), status=2),
    Case("pack-sft: output is a file", pack_sft_into_file, ("packed",), reads=("sft",)),
    Case("convert: onto an existing output", convert_onto_existing, ("dst",), reads=("pretrain",)),
    Case("convert: source not a token corpus", convert_not_a_corpus, ("src",), out="dst"),
    Case("convert: shard size below the minimum", convert_tiny_shards, ("shard",), out="dst", reads=("pretrain",)),
    Case("convert: unknown format", convert_unknown_format, ("--to",), status=2),
    Case("prepare-data: metadata.yaml not UTF-8", prepare_data_yaml_not_utf8, ("metadata.yaml", "utf-8")),
    Case("build on processes: missing input", build_on_processes_missing_input, ("nowhere.jsonl",), out="out"),
    Case("build on processes: malformed JSONL line", build_on_processes_bad_line, ("bad.jsonl", "line 5", "fix or remove"), out="out"),
    Case("train: not a cache", train_on_not_a_cache, ("empty",), out="run"),
]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_one_clear_line_and_no_complete_looking_output(case, world, tmp_path, capsys):
    check_case(case, world, tmp_path, capsys)


def check_case(case: Case, world: World, tmp_path: Path, capsys) -> None:
    """Run one case and hold it to the catalogue's three promises (the module docstring). The other
    catalogue modules (tests/test_bad_input_catalogue_*.py) run their cases through this too."""
    mounted = tmp_path / "out"
    try:
        argv = case.make(world, tmp_path)
        before = {name: _snapshot(getattr(world, name)) for name in case.reads}
        capsys.readouterr()
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse refusing a flag
            status = exc.code
        captured = capsys.readouterr()
        err = captured.err
        assert status == case.status, err
        assert "Traceback" not in err + captured.out, err
        if case.report:
            problems = [line for line in captured.out.splitlines() if line.startswith("MISMATCH")]
            assert len(problems) == 1, captured.out
            line = problems[0]
        else:
            lines = [line for line in err.splitlines() if line.strip()]
            assert lines, "nothing on stderr"
            errors = [line for line in lines if "error: " in line]
            assert len(errors) == 1 and errors[0] == lines[-1], err
            line = lines[-1]
        for phrase in case.expect:
            assert phrase.lower() in line.lower(), (phrase, line)
        if case.out is not None:
            out = tmp_path / case.out
            found = [p for p in out.rglob("*") if p.name in MARKERS] if out.is_dir() else []
            assert not found, f"complete-looking output: {found}"
        for name, snap in before.items():
            assert _snapshot(getattr(world, name)) == snap, f"{name} changed"
    finally:
        if mounted.is_mount():
            subprocess.run(["umount", str(mounted)], check=False)


def all_cases() -> list[Case]:
    """Every case of the catalogue: this module's and those of tests/test_bad_input_catalogue_*.py."""
    import importlib

    found = list(CASES)
    for path in sorted(Path(__file__).parent.glob("test_bad_input_catalogue_*.py")):
        found += importlib.import_module(f"{__package__}.{path.stem}" if __package__ else path.stem).CASES
    return found


def test_the_catalogue_covers_at_least_eighty_classes():
    cases = all_cases()
    assert len({c.name for c in cases}) == len(cases) >= 80
