"""The bad-input catalogue, part two: `build` (every executor), `train-tokenizer` and the output guard.

Each case is held to the catalogue's promises (tests/test_bad_input_catalogue.py: one `error:` line naming the
file, flag or record, no complete-looking output, every input unchanged) and, where a user's files sit where the
output would go, those files are unchanged too (`keeps`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (the shared fixture)


def _data(tmp: Path, name: str = "data", n: int = 12) -> Path:
    from .conftest import sample_texts

    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"text": t}) for t in sample_texts()[:n] if t.strip()]
    (d / "part.jsonl").write_text("\n".join(rows) + "\n")
    return d


def _build(w, tmp, *extra, src=None, out=None) -> list[str]:
    return ["build", str(src or _data(tmp)), "--out", str(out or tmp / "out"), "--tokenizer", str(w.tokenizer),
            "--no-progress", *extra]


USERS_FILES: list[Path] = []  # the user's files each case put where an output would go


def _users_dir(tmp: Path, name: str = "out") -> Path:
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "thesis.tex").write_text("years of work\n")
    USERS_FILES.append(d / "thesis.tex")
    return d


def build_onto_a_root_of_caches(w, tmp):
    root = tmp / "root"
    shutil.copytree(w.root / "cache", root)
    return _build(w, tmp, out=root)


def build_into_its_own_input(w, tmp):
    d = _data(tmp)
    return _build(w, tmp, src=d, out=d)


def build_inside_its_input(w, tmp):
    d = _data(tmp)
    return _build(w, tmp, src=d, out=d / "cache")


def build_into_the_current_directory(w, tmp):
    os.chdir(_data(tmp, "here"))
    return _build(w, tmp, src=tmp / "here", out=".")


def build_into_a_users_directory(w, tmp):
    return _build(w, tmp, out=_users_dir(tmp))


def build_onto_a_file(w, tmp):
    (tmp / "out").write_text("a file of mine\n")
    return _build(w, tmp)


def build_onto_a_dangling_symlink(w, tmp):
    (tmp / "out").symlink_to(tmp / "nowhere")
    return _build(w, tmp)


def build_onto_a_looping_symlink(w, tmp):
    (tmp / "out").symlink_to(tmp / "out")
    return _build(w, tmp, out=tmp / "out")


def build_from_a_looping_symlink(w, tmp):
    (tmp / "loop.jsonl").symlink_to(tmp / "loop.jsonl")
    return _build(w, tmp, src=tmp / "loop.jsonl")


def build_onto_a_tokenizer_directory(w, tmp):
    tok = tmp / "tok"
    shutil.copytree(Path(w.tokenizer).parent, tok)
    return _build(w, tmp, out=tok)


def build_truncated_zstd(w, tmp):
    import zstandard

    data = (_data(tmp) / "part.jsonl").read_bytes()
    blob = zstandard.ZstdCompressor().compress(data)
    (tmp / "in").mkdir()
    (tmp / "in" / "cut.jsonl.zst").write_bytes(blob[: len(blob) // 2])
    return _build(w, tmp, "--on-bad-record", "skip", src=tmp / "in")


def build_separator_inside_the_text(w, tmp):
    from niels_gpt.tokenizer import load_tokenizer

    from .tokenizer_backends.conftest import train_bpe

    train_bpe().save(str(tmp / "tokenizer.json"))  # a tokenizer of its own: --eos names any of its tokens
    ids = load_tokenizer(tmp / "tokenizer.json").encode(" the")
    argv = _build(w, tmp, "--eos", str(ids[0]))
    argv[argv.index("--tokenizer") + 1] = str(tmp / "tokenizer.json")
    return argv


def build_val_tokens_and_val_frac(w, tmp):
    return _build(w, tmp, "--val-tokens", "100", "--val-frac", "0.1")


def build_val_frac_out_of_range(w, tmp):
    return _build(w, tmp, "--val-frac", "1.5")


def build_chat_with_a_token_budget(w, tmp):
    return _build(w, tmp, "--chat", "--max-tokens", "1000")


def build_chat_columns_not_two(w, tmp):
    return _build(w, tmp, "--chat", "--chat-columns", "question")


def build_chat_layout_without_chat(w, tmp):
    return _build(w, tmp, "--format", "dolly")


def build_negative_workers(w, tmp):
    return _build(w, tmp, "--workers", "-1")


def build_task_bytes_zero(w, tmp):
    return _build(w, tmp, "--task-bytes", "0", "--executor", "processes")


def build_ray_nowhere(w, tmp):
    pytest.importorskip("ray")
    return _build(w, tmp, "--executor", "ray", "--ray-address", "127.0.0.1:9", "--connect-timeout", "5")


def build_connect_timeout_zero(w, tmp):
    return _build(w, tmp, "--connect-timeout", "0")


def build_train_tokenizer_too_small(w, tmp):
    argv = _build(w, tmp, "--train-tokenizer", "10")
    at = argv.index("--tokenizer")
    del argv[at:at + 2]
    return argv


def build_chat_records_without_chat(w, tmp):
    (tmp / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    return _build(w, tmp, src=tmp / "chats.jsonl")


def build_text_files_with_chat(w, tmp):
    (tmp / "notes.txt").write_text("just some notes\n")
    return _build(w, tmp, "--chat", src=tmp / "notes.txt")


def build_work_dir_of_a_user(w, tmp):
    return ["build", str(_data(tmp)), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer),
            "--work-dir", str(_users_dir(tmp, "work")), "--executor", "processes", "--no-progress"]


def build_work_dir_inside_out(w, tmp):
    return ["build", str(_data(tmp)), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer),
            "--work-dir", str(tmp / "out" / "work"), "--no-progress"]


def train_tokenizer_sources_without_out(w, tmp):
    return ["train-tokenizer", str(_data(tmp)), "--vocab-size", "500", "--no-progress"]


def train_tokenizer_vocab_zero(w, tmp):
    return ["train-tokenizer", str(_data(tmp)), "--out", str(tmp / "out"), "--vocab-size", "0", "--no-progress"]


def train_tokenizer_into_a_users_directory(w, tmp):
    return ["train-tokenizer", str(_data(tmp)), "--out", str(_users_dir(tmp)), "--vocab-size", "500",
            "--no-progress"]


def train_tokenizer_inside_its_input(w, tmp):
    d = _data(tmp)
    return ["train-tokenizer", str(d), "--out", str(d / "tok"), "--vocab-size", "500", "--no-progress"]


def train_tokenizer_onto_a_cache(w, tmp):
    c = tmp / "c"
    shutil.copytree(w.pretrain, c)
    return ["train-tokenizer", str(_data(tmp)), "--out", str(c), "--vocab-size", "500", "--no-progress"]


def _tiktoken(tmp: Path, ranks: list[tuple[bytes, int]]) -> Path:
    import base64

    path = tmp / "mine.tiktoken"
    path.write_text("".join(base64.b64encode(t).decode() + f" {r}\n" for t, r in ranks))
    return path


def build_tiktoken_rank_twice(w, tmp):
    bad = _tiktoken(tmp, [(bytes([i]), i) for i in range(256)] + [(b"ab", 7)])
    argv = _build(w, tmp)
    argv[argv.index("--tokenizer") + 1] = str(bad)
    return argv


def build_tiktoken_missing_bytes(w, tmp):
    bad = _tiktoken(tmp, [(b"a", 0), (b"b", 1), (b"ab", 2)])
    argv = _build(w, tmp)
    argv[argv.index("--tokenizer") + 1] = str(bad)
    return argv


def convert_narrower_than_the_vocabulary(w, tmp):
    from .formats.conftest import make_cache

    big = make_cache(tmp / "big", {"train": [[7, 5, 6]]}, dtype="uint32-le", vocab_size=70001)
    return ["convert", str(big), str(tmp / "out"), "--to", "nanogpt", "--dtype", "uint16"]


def build_from_a_server_that_is_down(w, tmp):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return _build(w, tmp, src=f"http://127.0.0.1:{port}/corpus.jsonl")


def stats_sequence_length_past_any_model(w, tmp):
    return ["stats", str(w.sft), "--seq-len", str(10**20)]


def download_onto_a_file(w, tmp):
    (tmp / "shards").write_text("a file\n")
    return ["download", "--out-dir", str(tmp / "shards"), "-n", "1", "--base-url", "http://127.0.0.1:9"]


CASES = [
    Case("build: onto a root of caches", build_onto_a_root_of_caches, ("root", "several outputs")),
    Case("build: into its own input", build_into_its_own_input, ("data", "input", "itself")),
    Case("build: inside its input directory", build_inside_its_input, ("inside the input directory",)),
    Case("build: into the current directory", build_into_the_current_directory, ("current directory",)),
    Case("build: into a directory of the user's", build_into_a_users_directory, ("thesis.tex", "not an output"),
         out="out"),
    Case("build: onto a file", build_onto_a_file, ("out", "a file, not a directory")),
    Case("build: onto a dangling symlink", build_onto_a_dangling_symlink, ("out", "target is missing")),
    Case("build: onto a looping symlink", build_onto_a_looping_symlink, ("out", "loops")),
    Case("build: from a looping symlink", build_from_a_looping_symlink, ("loop.jsonl", "loops back")),
    Case("build: onto a tokenizer directory", build_onto_a_tokenizer_directory, ("tok", "tokenizer directory")),
    Case("build: truncated zstd, bad records skipped", build_truncated_zstd, ("cut.jsonl.zst", "truncated"),
         out="out"),
    Case("build: --eos is a token of the text", build_separator_inside_the_text,
         ("document", "separator", "occurs inside its text", "--eos"), out="out"),
    Case("build: --val-tokens and --val-frac", build_val_tokens_and_val_frac, ("--val-tokens", "--val-frac"), out="out"),
    Case("build: --val-frac out of range", build_val_frac_out_of_range, ("--val-frac",), out="out"),
    Case("build: --chat with a token budget", build_chat_with_a_token_budget, ("--max-tokens", "--chat"), out="out"),
    Case("build: --chat-columns not two", build_chat_columns_not_two, ("--chat-columns", "USER_COL,ASSISTANT_COL"),
         out="out"),
    Case("build: a chat layout without --chat", build_chat_layout_without_chat, ("--format dolly", "pretraining"),
         out="out"),
    Case("build: negative --workers", build_negative_workers, ("--workers",), out="out"),
    Case("build: --task-bytes 0", build_task_bytes_zero, ("--task-bytes",), out="out"),
    Case("build: a Ray address where nothing listens", build_ray_nowhere, ("127.0.0.1:9", "ray"), out="out"),
    Case("build: --connect-timeout 0", build_connect_timeout_zero, ("--connect-timeout",), out="out"),
    Case("build: --train-tokenizer too small", build_train_tokenizer_too_small, ("--train-tokenizer", "at least 260"),
         out="out"),
    Case("build: chat records without --chat", build_chat_records_without_chat, ("chats.jsonl", "--chat"), out="out"),
    Case("build: text files with --chat", build_text_files_with_chat, ("notes.txt", "not a conversation"), out="out"),
    Case("build: a work directory of the user's", build_work_dir_of_a_user, ("--work-dir", "thesis.tex"),
         out="out"),
    Case("build: work directory inside the output", build_work_dir_inside_out, ("must not overlap",)),
    Case("train-tokenizer: sources without --out", train_tokenizer_sources_without_out, ("--out",)),
    Case("train-tokenizer: --vocab-size 0", train_tokenizer_vocab_zero, ("--vocab-size 0", "at least 260"), out="out"),
    Case("train-tokenizer: into a directory of the user's", train_tokenizer_into_a_users_directory,
         ("thesis.tex", "not an output"), out="out"),
    Case("train-tokenizer: inside its input", train_tokenizer_inside_its_input, ("inside the input directory",)),
    Case("train-tokenizer: onto a cache", train_tokenizer_onto_a_cache, ("c", "token cache", "tokenizer directory")),
    Case("download: onto a file", download_onto_a_file, ("shards", "a file, not a directory")),
    Case("build: a .tiktoken file giving a rank twice", build_tiktoken_rank_twice,
         ("mine.tiktoken", "line 257", "rank 7 was already given"), out="out"),
    Case("build: a .tiktoken file missing single bytes", build_tiktoken_missing_bytes,
         ("mine.tiktoken", "single byte"), out="out"),
    Case("build: from an http server that is down", build_from_a_server_that_is_down,
         ("corpus.jsonl", "cannot connect to 127.0.0.1", "not answering"), out="out"),
    Case("stats: --seq-len past any model", stats_sequence_length_past_any_model, ("--seq-len", "at most"),
         reads=("sft",)),
    Case("convert: --dtype narrower than the vocabulary", convert_narrower_than_the_vocabulary,
         ("--dtype uint16", "70,001 ids"), out="out"),
]


@pytest.fixture
def back_home():
    here = os.getcwd()
    yield
    os.chdir(here)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_build_input_gets_one_clear_line_and_nothing_lost(case, world, tmp_path, capsys, back_home):  # noqa: F811
    USERS_FILES.clear()
    check_case(case, world, tmp_path, capsys)
    for f in USERS_FILES:
        assert f.read_text() == "years of work\n", f
