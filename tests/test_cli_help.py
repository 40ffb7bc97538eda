"""--help reads as documentation: every flag has a real help line and shows its default."""

import argparse
import subprocess
import sys

import pytest

from niels_gpt.cache.cli import build_parser, main, package_version, program_name

PARSER = build_parser("niels-gpt-data")
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def options(name):
    return [a for a in SUBCOMMANDS[name]._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


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
    for build_only in ("--only", "--tokenizer", "--max-train-tokens", "--max-val-tokens", "--shard-bytes",
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
