"""Each source owns its config: its options are fields of BuildConfig and flags of build-all without
build_all.py or the CLI naming any of them, so a new source is one module and one line in CONFIGS."""

import dataclasses
import inspect
import re

import pytest

from niels_gpt import cli, sources
from niels_gpt.builders import build_all
from niels_gpt.builders.build_all import BuildConfig, make_source
from niels_gpt.cache.cli import build_parser
from niels_gpt.errors import ConfigError


def test_every_option_is_a_config_field_and_a_flag_with_its_default():
    fields = {f.name: f for f in dataclasses.fields(BuildConfig)}
    parser = build_parser("niels-gpt-data")
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name in ("build-all", "train-tokenizer"):
        flags = {o: a for a in sub[name]._actions for o in a.option_strings}
        for config in sources.CONFIGS.values():
            for option in config.options:
                assert fields[option.field].default == option.default
                assert flags[option.flag].default == option.default and flags[option.flag].help == option.help


def test_the_pipeline_and_the_cli_name_no_source_option():
    names = [o.field for c in sources.CONFIGS.values() for o in c.options]
    for module in (build_all, cli):
        text = inspect.getsource(module)
        named = [n for n in names if re.search(rf"\b{n}\b|--{n.replace('_', '-')}\b", text)]
        assert not named, f"{module.__name__} names source options {named}: they belong to the source's module"


def test_make_source_reads_each_source_from_its_own_options(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("- a note\n")
    src = make_source("roam", BuildConfig(roam_dir=str(tmp_path / "notes"), roam_val_frac=0.0))
    assert list(src.iter_texts("train")) == ["- a note\n"]
    assert make_source("gutenberg", BuildConfig()) is None  # nothing to read: not built
    with pytest.raises(ConfigError, match="roam needs its export directory: pass --roam-dir"):
        make_source("roam", BuildConfig())
    sample = make_source("roam", BuildConfig(sample=True))
    assert "sample" in str(sample.describe())
    with pytest.raises(ConfigError, match="unknown source 'nope'"):
        make_source("nope", BuildConfig())
    assert build_all.PRETRAIN == ("fineweb_edu", "roam", "wikitext", "gutenberg")
    assert build_all.SFT == ("dolly15k", "oasst1")
