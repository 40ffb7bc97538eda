"""The bad-input catalogue, part three of `build`: build-all's flags, odd input files (compressed in name only,
symlink loops, cut exports and books), layouts named without --chat, and tokenizer training on text it cannot use.

Each case is held to the catalogue's promises (tests/test_bad_input_catalogue.py: one `error:` line naming the
file, flag or record, no complete-looking output, every input unchanged).
"""

from __future__ import annotations

import json
import os
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


def build_all_workers_zero(w, tmp):
    return ["build-all", "--cache-dir", str(tmp / "out"), "--sample", "--only", "tokenizer", "roam",
            "--tokenizer", str(w.tokenizer), "--workers", "0", "--no-progress"]


def build_plain_text_named_zst(w, tmp):
    d = _data(tmp)
    (d / "more.jsonl.zst").write_text(json.dumps({"text": "not compressed at all"}) + "\n")
    return _build(w, tmp, src=d)


def build_plain_text_named_gz(w, tmp):
    d = _data(tmp)
    (d / "more.jsonl.gz").write_text(json.dumps({"text": "not compressed at all"}) + "\n")
    return _build(w, tmp, src=d)


def build_a_looping_symlink_inside_a_directory(w, tmp):
    d = _data(tmp)
    (d / "loop.jsonl").symlink_to(d / "loop.jsonl")
    return _build(w, tmp, src=d)


def train_tokenizer_a_looping_symlink_inside_a_directory(w, tmp):
    d = _data(tmp)
    (d / "sub").mkdir()
    (d / "sub" / "a.jsonl").symlink_to(d / "sub" / "b.jsonl")
    (d / "sub" / "b.jsonl").symlink_to(d / "sub" / "a.jsonl")
    return ["train-tokenizer", str(d), "--out", str(tmp / "out"), "--vocab-size", "300", "--no-progress"]


def build_max_tokens_zero(w, tmp):
    return _build(w, tmp, "--max-tokens", "0")


def build_all_both_budgets_zero(w, tmp):
    return ["build-all", "--cache-dir", str(tmp / "out"), "--sample", "--only", "tokenizer", "fineweb_edu",
            "--tokenizer", str(w.tokenizer), "--max-tokens", "0", "--val-tokens", "0", "--no-progress"]


def build_a_json_export_cut_short(w, tmp):
    from .conftest import sample_texts

    (tmp / "in").mkdir()
    text = json.dumps([{"text": t} for t in sample_texts()[:4]], indent=2)
    (tmp / "in" / "export.json").write_text(text[: len(text) // 2])
    return _build(w, tmp, src=tmp / "in")


def build_a_gutenberg_book_cut_before_its_end(w, tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "book.txt").write_text("The Project Gutenberg EBook of Cut\n\nLicence words.\n\n"
                                         "*** START OF THIS PROJECT GUTENBERG EBOOK CUT ***\n\nIt was a dark and "
                                         "stormy night; the rain fell in torrents, except at occasional\n")
    return _build(w, tmp, src=tmp / "in")


def build_all_a_gutenberg_book_cut_before_its_end(w, tmp):
    build_a_gutenberg_book_cut_before_its_end(w, tmp)
    return ["build-all", "--cache-dir", str(tmp / "out"), "--only", "gutenberg", "--gutenberg-dir", str(tmp / "in"),
            "--tokenizer", str(w.tokenizer), "--no-progress"]


def _train(tmp, src) -> list[str]:
    return ["train-tokenizer", str(src), "--out", str(tmp / "out"), "--vocab-size", "300", "--no-progress"]


def train_tokenizer_an_empty_file(w, tmp):
    (tmp / "empty.txt").write_text("")
    return _train(tmp, tmp / "empty.txt")


def train_tokenizer_a_whitespace_only_file(w, tmp):
    (tmp / "blank.txt").write_text("  \n\n\t \n")
    return _train(tmp, tmp / "blank.txt")


def train_tokenizer_a_lone_surrogate_escape(w, tmp):
    (tmp / "odd.jsonl").write_text('{"text": "half of a pair: \\ud83d and the rest"}\n')
    return _train(tmp, tmp / "odd.jsonl")


def train_tokenizer_a_lone_surrogate_in_a_json_export(w, tmp):
    (tmp / "odd.json").write_text('[\n  {"text": "half of a pair: \\ud83d and the rest"}\n]\n')
    return _train(tmp, tmp / "odd.json")


def train_tokenizer_a_surrogate_written_as_bytes(w, tmp):
    (tmp / "odd.txt").write_bytes(b"half of a pair: \xed\xa0\xbd and the rest\n")
    return _train(tmp, tmp / "odd.txt")


def train_tokenizer_a_dangling_symlink(w, tmp):
    (tmp / "gone.txt").symlink_to(tmp / "moved-away.txt")
    return _train(tmp, tmp / "gone.txt")


def train_tokenizer_a_dangling_symlink_inside_a_directory(w, tmp):
    d = _data(tmp)
    (d / "gone.jsonl").symlink_to(tmp / "moved-away.jsonl")
    return _train(tmp, d)


def train_tokenizer_a_dangling_symlink_in_a_glob(w, tmp):
    d = _data(tmp)
    (d / "gone.jsonl").symlink_to(tmp / "moved-away.jsonl")  # was left out as "unknown file kind '.jsonl'"
    return _train(tmp, f"{d}/*.jsonl")


USERS_FILES: list[Path] = []  # the user's files each case put where an output would go


def _train_in_build(w, tmp, vocab: str) -> list[str]:
    argv = _build(w, tmp, "--train-tokenizer", vocab)
    at = argv.index("--tokenizer")
    del argv[at:at + 2]
    return argv


def build_train_tokenizer_too_small_for_the_text(w, tmp):
    return _train_in_build(w, tmp, "262")


def build_train_tokenizer_beside_a_users_tokenizer_directory(w, tmp):
    d = tmp / "tokenizer"
    d.mkdir()
    (d / "tokenizer.json").write_text("years of work\n")
    USERS_FILES.append(d / "tokenizer.json")
    return _train_in_build(w, tmp, "400")


def build_format_messages_without_chat(w, tmp):
    (tmp / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                              {"role": "assistant", "content": "hello"}]}) + "\n")
    return _build(w, tmp, "--format", "messages", src=tmp / "chats.jsonl")


def build_format_text_with_chat(w, tmp):
    return _build(w, tmp, "--format", "text", "--chat")


def _roam_with(tmp, name: str, target: str) -> Path:
    d = tmp / "notes"
    d.mkdir()
    (d / "a.md").write_text("- a note\n")
    (d / name).symlink_to(target)
    return d


def build_all_a_looping_symlink_in_the_roam_directory(w, tmp):
    d = _roam_with(tmp, "loop.md", "loop.md")
    return ["build-all", "--cache-dir", str(tmp / "out"), "--only", "roam", "--roam-dir", str(d),
            "--tokenizer", str(w.tokenizer), "--no-progress"]


def build_all_a_dangling_symlink_in_the_roam_directory(w, tmp):
    d = _roam_with(tmp, "moved.md", "elsewhere.md")
    return ["build-all", "--cache-dir", str(tmp / "out"), "--only", "roam", "--roam-dir", str(d),
            "--tokenizer", str(w.tokenizer), "--no-progress"]


def build_a_directory_of_unknown_files_only(w, tmp):
    d = tmp / "dict"
    d.mkdir()
    (d / "gcide.dict").write_text("A word, n. a unit of speech.\n")
    return _build(w, tmp, src=d)


def build_read_as_an_unknown_kind(w, tmp):
    return _build(w, tmp, "--read-as", ".dict=words")


def build_read_as_without_a_dot(w, tmp):
    return _build(w, tmp, "--read-as", "dict=text")


def build_plain_text_named_txt_gz(w, tmp):
    d = tmp / "books"
    d.mkdir()
    (d / "book.txt.gz").write_text("plain text, not gzip at all\n")
    return _build(w, tmp, src=d)


def _own_spm(tmp: Path) -> Path:
    """A sentencepiece model of its own conventions (`<s>`, `</s>`, byte fallback), as Llama's and Mistral's."""
    import io

    import sentencepiece as spm

    from .conftest import sample_texts

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([t for t in sample_texts()[:20] if t.strip()]),
                                   model_writer=model, model_type="bpe", vocab_size=500, byte_fallback=True,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    d = tmp / "mistral"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(model.getvalue())
    return d / "tokenizer.model"


def _chats(tmp: Path) -> Path:
    f = tmp / "chats.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "hello"}]}) + "\n")
    return f


def build_chat_with_an_own_sentencepiece_model_and_no_template(w, tmp):
    return ["build", str(_chats(tmp)), "--chat", "--out", str(tmp / "out"), "--tokenizer", str(_own_spm(tmp)),
            "--no-progress"]


def build_chat_template_that_is_missing(w, tmp):
    return ["build", str(_chats(tmp)), "--chat", "--out", str(tmp / "out"), "--tokenizer", str(_own_spm(tmp)),
            "--chat-template", str(tmp / "nowhere.jinja"), "--no-progress"]


def build_chat_template_with_the_librarys_tokenizer(w, tmp):
    (tmp / "chat.jinja").write_text("{{ messages }}")
    return ["build", str(_chats(tmp)), "--chat", "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer),
            "--chat-template", str(tmp / "chat.jinja"), "--no-progress"]


CASES = [
    Case("build: --chat with a sentencepiece model of its own and no chat template",
         build_chat_with_an_own_sentencepiece_model_and_no_template,
         ("tokenizer.model", "--chat needs a chat template", "--chat-template FILE", "tokenizer_config.json"),
         out="out"),
    Case("build: --chat-template naming no file", build_chat_template_that_is_missing,
         ("nowhere.jinja", "cannot read this chat template"), out="out"),
    Case("build: --chat-template with the library's tokenizer", build_chat_template_with_the_librarys_tokenizer,
         ("--chat-template applies to other tokenizers only", "leave it out"), out="out"),
    Case("build: a directory holding only files of an unknown kind", build_a_directory_of_unknown_files_only,
         ("dict", "no files of a known kind", ".dict", "--read-as .dict=text", "--format text"), out="out"),
    Case("build: --read-as an unknown kind", build_read_as_an_unknown_kind, ("--read-as .dict=words", "text"),
         out="out"),
    Case("build: --read-as a suffix without its dot", build_read_as_without_a_dot,
         ("--read-as dict=text", "start with a dot"), out="out"),
    Case("build: plain text named .txt.gz", build_plain_text_named_txt_gz,
         ("book.txt.gz", "not gzip", "plain text"), out="out"),
    Case("build-all: --workers 0, refused before the tokenizer", build_all_workers_zero, ("--workers 0", ">= 1"),
         out="out"),
    Case("build: --max-tokens 0 and no val split", build_max_tokens_zero, ("--max-tokens 0", "--val-tokens"),
         out="out"),
    Case("build-all: both budgets 0, refused before the tokenizer", build_all_both_budgets_zero,
         ("--max-tokens 0", "--val-tokens 0", "fineweb_edu"), out="out"),
    Case("build: a pretty-printed .json export cut short", build_a_json_export_cut_short,
         ("export.json", "not valid json"), out="out"),
    Case("build: a Gutenberg book cut before its END line", build_a_gutenberg_book_cut_before_its_end,
         ("book.txt", "no '*** END OF", "truncated", "--format text"), out="out"),
    Case("build-all: a Gutenberg book cut before its END line", build_all_a_gutenberg_book_cut_before_its_end,
         ("book.txt", "no '*** END OF", "build FILE --format text"), out="out/pretrain"),
    Case("train-tokenizer: an empty file", train_tokenizer_an_empty_file,
         ("empty.txt", "empty", "no text to train", "files that hold text"), out="out"),
    Case("train-tokenizer: a whitespace-only file", train_tokenizer_a_whitespace_only_file,
         ("blank.txt", "only whitespace", "no text to train"), out="out"),
    Case("train-tokenizer: a lone surrogate escape", train_tokenizer_a_lone_surrogate_escape,
         ("odd.jsonl", "line 1", "lone surrogate", "fix the escape"), out="out"),
    Case("train-tokenizer: a lone surrogate escape in a .json export",
         train_tokenizer_a_lone_surrogate_in_a_json_export, ("odd.json", "record 1", "lone surrogate"), out="out"),
    Case("train-tokenizer: a surrogate written as UTF-8 bytes", train_tokenizer_a_surrogate_written_as_bytes,
         ("odd.txt", "byte 16", "lone utf-16 surrogate", "replace these bytes"), out="out"),
    Case("train-tokenizer: a dangling symlink", train_tokenizer_a_dangling_symlink,
         ("gone.txt", "symlink to nothing"), out="out"),
    Case("train-tokenizer: a dangling symlink inside an input directory",
         train_tokenizer_a_dangling_symlink_inside_a_directory, ("gone.jsonl", "moved-away.jsonl", "is missing"),
         out="out"),
    Case("train-tokenizer: a dangling symlink matched by a glob", train_tokenizer_a_dangling_symlink_in_a_glob,
         ("gone.jsonl", "moved-away.jsonl", "is missing"), out="out"),
    Case("build: --train-tokenizer too small for the text", build_train_tokenizer_too_small_for_the_text,
         ("--train-tokenizer 262", "too small for this text", "raise --train-tokenizer to"), out="out"),
    Case("build: --train-tokenizer beside a tokenizer directory of the user's",
         build_train_tokenizer_beside_a_users_tokenizer_directory,
         ("tokenizer", "--train-tokenizer", "not an output", "tokenizer.json", "--tokenizer DIR"), out="out"),
    Case("build: --format messages without --chat", build_format_messages_without_chat,
         ("--format messages", "chat layout", "add --chat"), out="out"),
    Case("build: --format text with --chat", build_format_text_with_chat, ("--format text", "drop --chat"), out="out"),
    Case("build-all: a looping symlink in the roam directory", build_all_a_looping_symlink_in_the_roam_directory,
         ("loop.md", "loops back"), out="out/pretrain"),
    Case("build-all: a dangling symlink in the roam directory", build_all_a_dangling_symlink_in_the_roam_directory,
         ("moved.md", "elsewhere.md", "is missing"), out="out/pretrain"),
    Case("build: plain text named .jsonl.zst", build_plain_text_named_zst,
         ("more.jsonl.zst", "not zstd data", "rename it"), out="out"),
    Case("build: plain text named .jsonl.gz", build_plain_text_named_gz,
         ("more.jsonl.gz", "not gzip data", "rename it"), out="out"),
    Case("build: a looping symlink inside an input directory", build_a_looping_symlink_inside_a_directory,
         ("loop.jsonl", "loops back"), out="out"),
    Case("train-tokenizer: two symlinks pointing at each other in an input directory",
         train_tokenizer_a_looping_symlink_inside_a_directory, ("a.jsonl", "loops back"), out="out"),
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
