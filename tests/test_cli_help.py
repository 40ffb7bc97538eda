"""--help reads as documentation: every flag has a real help line and shows its default."""

import argparse
import json
import subprocess
import sys

import pytest

from niels_gpt.cache.cli import build_parser, main, package_version, program_name

PARSER = build_parser("niels-gpt-data")
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def options(name):
    """The flags --help shows (an older spelling is parsed but not shown)."""
    return [a for a in SUBCOMMANDS[name]._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
            and a.help != argparse.SUPPRESS]


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_flag_has_a_help_line_that_shows_its_default(name):
    text = SUBCOMMANDS[name].format_help()
    for action in options(name):
        assert action.help and action.help.strip() not in ("-", ""), f"{name} {action.option_strings}: no help"
        if action.nargs == 0 or action.required:
            continue
        shown = SUBCOMMANDS[name]._get_formatter()._get_help_string(action) % {"default": action.default}
        assert "default" in shown, f"{name} {action.option_strings}: the help says nothing of the default"
    assert " -\n" not in text


def test_the_defaults_the_issue_named_are_shown():
    assert "tokens to decode (default: 64)" in " ".join(SUBCOMMANDS["inspect"].format_help().split())
    prepare = " ".join(SUBCOMMANDS["prepare-data"].format_help().split())
    assert "--dtype {uint16,uint32} dtype of a headerless .bin (default: what meta.json" in prepare


def test_on_off_flags_do_not_print_a_backwards_default():
    text = " ".join(SUBCOMMANDS["build-all"].format_help().split())
    assert "--no-split-digits let a piece span several digits (by default every digit is its own piece)" in text
    assert "(default: True)" not in text and "(default: False)" not in text


def test_train_tokenizer_takes_only_its_own_flags():
    flags = {s for a in options("train-tokenizer") for s in a.option_strings}
    assert {"--vocab-size", "--cache-dir", "--seed", "--sample", "--gutenberg-dir"} <= flags
    for build_only in ("--only", "--tokenizer", "--max-tokens", "--val-tokens", "--max-train-tokens", "--shard-bytes",
                       "--shuffle-buffer", "--val-frac", "--workers"):
        assert build_only not in flags
    with pytest.raises(SystemExit):
        PARSER.parse_args(["train-tokenizer", "--max-train-tokens", "5"])


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip().endswith(package_version())
    assert package_version()[0].isdigit()


def test_program_names_itself_as_called():
    assert program_name("/usr/local/bin/niels-gpt-data") == "niels-gpt-data"
    assert program_name("/x/niels_gpt/cache/cli.py") == "python -m niels_gpt.cache.cli"
    assert program_name("/x/niels_gpt/__main__.py") == "python -m niels_gpt"


def test_console_script_usage_names_the_console_script():
    script = __import__("pathlib").Path(sys.executable).with_name("niels-gpt-data")
    if not script.exists():
        pytest.skip("console script not installed in this environment")
    out = subprocess.run([str(script), "verify", "--help"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("usage: niels-gpt-data verify")


def test_one_idea_reads_the_same_in_every_subcommand():
    """Sizes take 128MiB-style values everywhere; workers and sequence length have the same spelling."""
    convert = PARSER.parse_args(["convert", "src", "dst", "--to", "niels", "--shard-bytes", "128MiB"])
    assert convert.shard_bytes == 128 * 2**20
    assert PARSER.parse_args(["download", "--workers", "3"]).num_workers == 3
    assert PARSER.parse_args(["download", "--num-workers", "3"]).num_workers == 3  # the older spelling
    assert PARSER.parse_args(["pack-sft", "c", "o", "--seq-len", "64"]).pack_size == 64
    assert PARSER.parse_args(["pack-sft", "c", "o", "--pack-size", "64"]).pack_size == 64
    with pytest.raises(SystemExit):
        PARSER.parse_args(["convert", "src", "dst", "--to", "niels", "--shard-bytes", "lots"])


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_help_names_each_default_once_and_in_words(name):
    text = " ".join(SUBCOMMANDS[name].format_help().split())
    assert "4611686018427387904" not in text, f"{name}: an 'all' sentinel printed as a number"
    assert "(default: [])" not in text
    import re

    doubled = re.findall(r"\(default[^()]*(?:\([^()]*\)[^()]*)*\) \(default", text)
    assert not doubled, f"{name}: a default named twice: {doubled}"


def test_top_level_help_lists_every_command():
    text = " ".join(PARSER.format_help().split())
    for name in SUBCOMMANDS:
        assert name in text.split("positional arguments")[0], f"the description does not list {name}"


LIGHT_VERBS = ["", "build", "build-all", "train-tokenizer", "inspect", "verify", "stats", "convert", "prepare-data",
               "download", "pack-sft", "trace", "train", "sample"]


@pytest.mark.parametrize("verb", LIGHT_VERBS, ids=[v or "top-level" for v in LIGHT_VERBS])
def test_help_of_a_command_that_needs_no_torch_does_not_import_it(verb):
    code = ("import sys\nfrom niels_gpt.cli import main\ntry:\n    main([*sys.argv[1:], '--help'])\n"
            "except SystemExit:\n    pass\nprint('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *verb.split()], capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("usage:"), r.stdout + r.stderr
    assert r.stderr.strip().endswith("no torch"), r.stderr[-500:]


def test_a_command_runs_with_only_its_own_parser_built():
    from niels_gpt.cli import HELP, build_parser

    lean = build_parser("x", only="convert")
    sub = next(a for a in lean._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(sub) == set(HELP)  # every command is named
    assert lean.parse_args(["convert", "a", "b", "--to", "niels"]).to == "niels"
    assert not any(a.option_strings for a in sub["train"]._actions if a.dest != "network_timeout_after")


def test_output_to_a_reader_that_left_ends_quietly(tmp_path):
    """`niels-gpt-data ... | head`: the reader leaves, the command stops with 141 and no traceback."""
    import os

    import numpy as np

    from .conftest import write_pretrain_cache

    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.arange(100) % 50]})

    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line is written
    try:
        p = subprocess.run([sys.executable, "-m", "niels_gpt.cli", "verify", str(cache)], stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr[-800:]
    assert p.returncode == 141, (p.returncode, p.stderr[-800:])


OLD_SPELLINGS = {"--sequence-len": "--seq-len", "--pack-size": "--seq-len", "--num-workers": "--workers",
                 "--max-train-tokens": "--max-tokens", "--max-val-tokens": "--val-tokens"}


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_no_subcommand_shows_two_spellings_of_one_idea(name):
    import re

    shown = set(re.findall(r"--[a-z][a-z0-9-]*", SUBCOMMANDS[name].format_help()))
    old = {flag: OLD_SPELLINGS[flag] for flag in shown & set(OLD_SPELLINGS)}
    assert not old, f"{name} --help shows older spellings (use the one name): {old}"


@pytest.mark.parametrize(("argv", "old", "new", "dest"), [
    (["train", "d"], "--sequence-len", "--seq-len", "sequence_len"),
    (["train", "d"], "--num-workers", "--workers", "num_workers"),
    (["pack-sft", "c", "o"], "--pack-size", "--seq-len", "pack_size"),
    (["download"], "--num-workers", "--workers", "num_workers"),
    (["build-all"], "--max-train-tokens", "--max-tokens", "max_train_tokens"),
    (["build-all"], "--max-val-tokens", "--val-tokens", "max_val_tokens"),
])
def test_older_spellings_still_parse_as_the_one_name(argv, old, new, dest):
    default = getattr(PARSER.parse_args(argv), dest)
    assert getattr(PARSER.parse_args([*argv, new, "77"]), dest) == 77 != default
    assert getattr(PARSER.parse_args([*argv, old, "77"]), dest) == 77
    assert new in SUBCOMMANDS[argv[0]].format_help()


def test_every_seed_defaults_to_42():
    for argv in (["train", "d"], ["pack-sft", "c", "o"], ["sample", "ckpt.pt", "--prompt", "x"], ["build-all"],
                 ["train-tokenizer"], ["build", "src", "--out", "o", "--tokenizer", "t"]):
        assert PARSER.parse_args(argv).seed == 42, argv


def test_looking_at_outputs_does_not_import_torch(tokenizer, tmp_path):
    """`inspect`, `verify` and `stats` of a pretraining cache, an SFT cache, packed bins and packed Parquet
    run to the end without torch (~1 s to import); `stats` of a mixture file draws with torch, as training does."""
    from niels_gpt.packing import open_packed, write_packed_parquet

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i} of the corpus, with some words"}) + "\n"
                            for i in range(60)), encoding="utf-8")
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"},
                                                      {"role": "assistant", "content": f"hello {i}"}]}) + "\n"
                             for i in range(60)), encoding="utf-8")
    for src, out, extra in ((docs, "pre", []), (chats, "sft", ["--chat"])):
        assert main(["build", str(src), "--out", str(tmp_path / out), "--tokenizer", tokenizer.model_path,
                     "--val-frac", "0.2", "--no-progress", *extra]) == 0
    assert main(["pack-sft", str(tmp_path / "sft"), str(tmp_path / "bins"), "--seq-len", "64"]) == 0
    write_packed_parquet(open_packed(tmp_path / "bins"), tmp_path / "pq" / "bins.parquet")
    verbs = [[verb, str(tmp_path / name)] for name in ("pre", "sft", "bins", "pq") for verb in ("inspect", "verify", "stats")]
    code = ("import json, sys\nfrom niels_gpt.cli import main\nfor argv in json.loads(sys.argv[1]):\n"
            "    assert main(argv) == 0, argv\n    assert 'torch' not in sys.modules, ('torch imported', argv)\n")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(verbs)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert out.count(", 0 problem(s)") == 4 and "first 64 tokens of train/shard_00000.bin" in out, out[-3000:]
    assert "train example 0" in out and "(PackedMemmapDataset)" in out and "(PackedParquetDataset)" in out
    assert "pretrain " in out and "sft " in out and out.count("packed ") >= 2  # the four stats headings


@pytest.mark.parametrize("argv, blas", [(["verify", "/nonexistent-cache"], "1"),
                                         (["--network-timeout", "9", "stats", "/nonexistent-cache"], "1"),
                                         (["train", "--help"], None), (["sample", "--help"], None)])
def test_only_the_model_commands_keep_numpys_blas_threads(argv, blas):
    """`python -m niels_gpt` and the console script give numpy's OpenBLAS one thread, before numpy is loaded,
    for every command but train and sample (its threads spin ~0.1 s of CPU each once loaded); a user's own
    setting stays."""
    code = ("import atexit, os, sys\nfrom niels_gpt.__main__ import run\n"
            "atexit.register(lambda: print('BLAS', os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules))\n"
            f"sys.argv = ['niels-gpt-data', *{argv!r}]\nrun()\n")
    # the contract's path, python -m niels_gpt.cache.cli, as a program
    contract = ("import atexit, os, runpy, sys\n"
                "atexit.register(lambda: print('BLAS', os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules))\n"
                f"sys.argv = ['cli.py', *{argv!r}]\nrunpy.run_module('niels_gpt.cache.cli', run_name='__main__')\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for program in (code, contract):
        r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env)
        assert f"BLAS {blas} True" in r.stdout, r.stdout[-300:] + r.stderr[-500:]
        r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                           env={**env, "OPENBLAS_NUM_THREADS": "3"})
        assert "BLAS 3 True" in r.stdout, r.stdout[-300:] + r.stderr[-500:]


def test_the_console_script_is_the_module_entry():
    from niels_gpt.__main__ import run

    entry = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli").loads(
        (__import__("pathlib").Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == {"niels-gpt-data": f"{run.__module__}:{run.__name__}"}
