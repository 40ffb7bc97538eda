"""The named sources are one table (sources/named.py): their options are flags of build-all with their defaults,
build_all.py and the CLI name none of them, and each becomes a `BuildSpec` over the one input layer."""

import inspect
import re

import pytest

from niels_gpt import cli
from niels_gpt.builders import build_all
from niels_gpt.builders.build_all import BuildConfig, recipe
from niels_gpt.cache.cli import build_parser
from niels_gpt.errors import ConfigError
from niels_gpt.sources.named import NAMED, OPTIONS, inputs


def test_every_option_is_a_flag_with_its_default():
    parser = build_parser("niels-gpt-data")
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name in ("build-all", "train-tokenizer"):
        flags = {o: a for a in sub[name]._actions for o in a.option_strings}
        for option in OPTIONS.values():
            assert flags[option.flag].default == option.default and flags[option.flag].help == option.help


def test_the_pipeline_and_the_cli_name_no_source_option():
    for module in (build_all, cli):
        text = inspect.getsource(module)
        named = [n for n in OPTIONS if re.search(rf"\b{n}\b|--{n.replace('_', '-')}\b", text)]
        assert not named, f"{module.__name__} names source options {named}: they belong to sources/named.py"


def test_each_named_source_is_a_build_of_the_one_input_layer(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("- a note\n")
    (tmp_path / "notes" / "b.txt").write_text("not a note\n")
    spec = recipe("roam", BuildConfig(cache_dir=str(tmp_path / "c"), options={"roam_dir": str(tmp_path / "notes"),
                                                                               "roam_val_frac": 0.0}), None)
    assert spec.sources == [str(tmp_path / "notes" / "a.md")] and spec.val_sources == [] and spec.layout == "text"
    assert spec.extra["skipped_inputs"][0]["path"].endswith("b.txt")
    assert recipe("gutenberg", BuildConfig(), None) is None  # nothing to read: not built
    with pytest.raises(ConfigError, match="roam needs its export directory: pass --roam-dir"):
        recipe("roam", BuildConfig(), None)
    with pytest.raises(ConfigError, match="unknown source 'nope'"):
        inputs("nope", {}, 0)
    hub = {name: inputs(name, {}, 42) for name in ("fineweb_edu", "wikitext", "dolly15k", "oasst1")}
    assert hub["fineweb_edu"] == {"sources": ["HuggingFaceFW/fineweb-edu"], "layout": "text",
                                  "hf_config": "CC-MAIN-2024-10", "split": "train", "shuffle_buffer": 10_000}
    assert hub["wikitext"]["sources"] == hub["wikitext"]["val_sources"] == ["Salesforce/wikitext"]
    assert (hub["wikitext"]["split"], hub["wikitext"]["val_split"]) == ("train", "validation")
    assert hub["dolly15k"] == {"sources": ["databricks/databricks-dolly-15k"], "layout": "dolly", "chat": True}
    assert hub["oasst1"] == {"sources": ["OpenAssistant/oasst1"], "layout": "oasst", "chat": True,
                             "split": "train+validation"}
    sample = {name: recipe(name, BuildConfig(sample=True), None) for name in NAMED}
    assert all("sample" in str(s.sources[0]) for s in sample.values())
    assert build_all.PRETRAIN == ("fineweb_edu", "roam", "wikitext", "gutenberg")
    assert build_all.SFT == ("dolly15k", "oasst1")
