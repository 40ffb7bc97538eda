"""build-all's named sources: each one a layout of the one input layer and a row of defaults.

| name        | kind     | the hub (dataset id, config, split)                  | layout     | val split                 |
|-------------|----------|------------------------------------------------------|------------|---------------------------|
| fineweb_edu | pretrain | HuggingFaceFW/fineweb-edu, CC-MAIN-2024-10, train     | text       | by budget (build-all's)   |
| wikitext    | pretrain | Salesforce/wikitext, wikitext-103-raw-v1, train       | wikitext   | the dataset's validation  |
| roam        | pretrain | - (a directory of .md notes)                         | text       | by file (seeded)          |
| gutenberg   | pretrain | - (a directory of Project Gutenberg .txt books)      | gutenberg  | by file (seeded)          |
| dolly15k    | sft      | databricks/databricks-dolly-15k, -, train             | dolly      | by example (--val-frac)   |
| oasst1      | sft      | OpenAssistant/oasst1, -, train+validation             | oasst      | by example (--val-frac)   |

Each `Option` is a flag of build-all and train-tokenizer (`--roam-dir` for `roam_dir`); `local` names those
pointing at the user's own files, which replace the bundled sample with --sample. `inputs(...)` gives the
`BuildSpec` fields `build` reads for one source. fineweb_edu from the hub is `load_dataset(...,
streaming=True).shuffle(seed, buffer_size)` read in order (builders/plan.py); from local files, the builder's
seeded buffer. A split by file is `base.FILE_SPLIT_RULE`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from niels_gpt.errors import ConfigError
from niels_gpt.sources.base import FILE_SPLIT_RULE, SAMPLE_DIR, portable, split_by_file
from niels_gpt.sources.oasst_trees import holds_nested_trees
from niels_gpt.sources.text_io import files_under, list_files, read_bytes

READ_AS_TEXT = "to read it, build it with `build FILE --format text` (or --read-as SUFFIX=text)"


@dataclass(frozen=True)
class Option:
    field: str  # the key in BuildConfig.options; the flag is --field-with-dashes
    default: Any
    help: str
    type: Callable[[str], Any] | None = None
    nargs: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    def add_to(self, group) -> None:
        extra = {k: v for k, v in (("type", self.type), ("nargs", self.nargs)) if v is not None}
        group.add_argument(self.flag, default=self.default, help=self.help, **extra)


@dataclass(frozen=True)
class Named:
    name: str
    kind: str  # "pretrain" or "sft"
    title: str  # the --help group its flags are listed under
    layout: str
    options: tuple[Option, ...]
    local: tuple[str, ...]  # options naming the user's own data (these replace the sample corpus)
    sample: dict  # option values that point it at the bundled sample corpus


def _files(name: str) -> tuple[Option, Option]:
    what = "notes" if name == "roam" else "books"
    return (Option(f"{name}_dir", None, f"{'Roam Research markdown export' if name == 'roam' else 'Project Gutenberg .txt books'} "
                                        "(default: not built)"),
            Option(f"{name}_val_frac", 0.1, f"share of {what} in val (seeded)", type=float))


NAMED: dict[str, Named] = {n.name: n for n in (
    Named("fineweb_edu", "pretrain", "fineweb_edu (streamed)", "text", options=(
        Option("fineweb_dataset", "HuggingFaceFW/fineweb-edu", "Hugging Face dataset id"),
        Option("fineweb_config", "CC-MAIN-2024-10", "dataset config (a Common Crawl dump)"),
        Option("fineweb_split", "train", "dataset split to stream"),
        Option("fineweb_buffer_size", 10_000, "documents in the seeded shuffle buffer: datasets' shuffle(seed, "
               "buffer_size) of the hub stream; the builder's torch buffer for local files", type=int),
        Option("fineweb_data_files", None, "local parquet/jsonl files of the same schema (default: stream the hub)",
               nargs="+")),
        local=("fineweb_data_files",), sample={"fineweb_data_files": ["fineweb_edu/web-cc-sample.parquet"]}),
    Named("roam", "pretrain", "roam", "text", options=_files("roam"), local=("roam_dir",),
          sample={"roam_dir": "roam"}),
    Named("wikitext", "pretrain", "wikitext", "wikitext", options=(
        Option("wikitext_dataset", "Salesforce/wikitext", "Hugging Face dataset id"),
        Option("wikitext_config", "wikitext-103-raw-v1", "dataset config"),
        Option("wikitext_train_file", None, "local raw train file (default: the hub)"),
        Option("wikitext_val_file", None, "local raw validation file (default: the hub)")),
        local=("wikitext_train_file", "wikitext_val_file"),
        sample={"wikitext_train_file": "wikitext/wiki.train.raw", "wikitext_val_file": "wikitext/wiki.valid.raw"}),
    Named("gutenberg", "pretrain", "gutenberg", "gutenberg", options=_files("gutenberg"),
          local=("gutenberg_dir",), sample={"gutenberg_dir": "gutenberg"}),
    Named("dolly15k", "sft", "dolly15k", "dolly", options=(
        Option("dolly_dataset", "databricks/databricks-dolly-15k", "Hugging Face dataset id"),
        Option("dolly_data_files", None, "local jsonl/parquet files (default: the hub)", nargs="+")),
        local=("dolly_data_files",), sample={"dolly_data_files": ["dolly15k/databricks-dolly-15k.first34.jsonl"]}),
    Named("oasst1", "sft", "oasst1", "oasst", options=(
        Option("oasst_dataset", "OpenAssistant/oasst1", "Hugging Face dataset id"),
        Option("oasst_data_files", None, "local flat-row files (default: the hub)", nargs="+"),
        Option("oasst_trees_jsonl", None,
               "nested-tree JSONL export (default: flat rows from --oasst-data-files or the hub)")),
        local=("oasst_data_files", "oasst_trees_jsonl"), sample={"oasst_data_files": ["oasst1/oasst1-rows.parquet"]}),
)}
OPTIONS = {o.field: o for n in NAMED.values() for o in n.options}


def values_of(name: str, options: dict, sample: bool) -> dict:
    """A source's option values over the defaults; with `sample`, the bundled sample unless given local data."""
    named = NAMED[name]
    values = {o.field: options.get(o.field, o.default) for o in named.options}
    if sample and not any(values[f] is not None for f in named.local):
        for key, rel in named.sample.items():
            values[key] = [str(SAMPLE_DIR / r) for r in rel] if isinstance(rel, list) else str(SAMPLE_DIR / rel)
    return values


def inputs(name: str, options: dict, seed: int, sample: bool = False) -> dict | None:
    """What `build` reads for the named source: BuildSpec fields, or None when it has nothing to read."""
    if name not in NAMED:
        raise ConfigError(f"unknown source {name!r}; expected one of {', '.join(NAMED)}")
    v = values_of(name, options, sample)
    layout = NAMED[name].layout
    if name == "fineweb_edu":
        if v["fineweb_buffer_size"] < 1:
            raise ConfigError(f"--fineweb-buffer-size {v['fineweb_buffer_size']}: must be >= 1")
        hub = not v["fineweb_data_files"]
        return {"sources": [v["fineweb_dataset"]] if hub else _listed(v["fineweb_data_files"]), "layout": layout,
                "hf_config": v["fineweb_config"] if hub else None, "split": v["fineweb_split"] if hub else "train",
                "shuffle_buffer": v["fineweb_buffer_size"]}
    if name == "wikitext":
        train, val = v["wikitext_train_file"], v["wikitext_val_file"]
        if train is None and val is None:
            return {"sources": [v["wikitext_dataset"]], "val_sources": [v["wikitext_dataset"]], "layout": layout,
                    "hf_config": v["wikitext_config"], "split": "train", "val_split": "validation",
                    "extra": {"split_rule": "the dataset's own splits: train -> train, validation -> val"}}
        if train is None:
            raise ConfigError("wikitext: --wikitext-val-file without --wikitext-train-file; give the train file too")
        return {"sources": [train], "val_sources": [val] if val else [], "layout": layout,
                "extra": {"split_rule": "the files' own splits: --wikitext-train-file -> train, --wikitext-val-file -> val"}}
    if name in ("roam", "gutenberg"):
        directory = v[f"{name}_dir"]
        if not directory:
            if name == "roam":
                raise ConfigError("roam needs its export directory: pass --roam-dir DIR (or leave roam out with --only, "
                                  "or use --sample)")
            return None
        return _split_by_file(name, Path(directory), ".md" if name == "roam" else ".txt", v[f"{name}_val_frac"], seed)
    if name == "dolly15k":
        files = v["dolly_data_files"]
        return {"sources": _listed(files) if files else [v["dolly_dataset"]], "layout": layout, "chat": True}
    files, trees = v["oasst_data_files"], v["oasst_trees_jsonl"]
    if files and trees:
        raise ConfigError("oasst1: pass --oasst-data-files (flat rows) or --oasst-trees-jsonl (nested trees), not both")
    listed = _listed(trees or files) if trees or files else None
    if listed and not trees and any(holds_nested_trees(Path(p)) for p in listed) \
            and not all(holds_nested_trees(Path(p)) for p in listed):
        raise ConfigError(f"oasst1 --oasst-data-files: {listed} mix nested trees (one tree per line) and flat message "
                          "rows; pass the nested ones as --oasst-trees-jsonl and the flat ones as --oasst-data-files")
    return {"sources": listed or [v["oasst_dataset"]], "layout": layout, "chat": True,
            **({} if listed else {"split": "train+validation"})}


def _listed(value) -> list[str]:
    return [str(value)] if isinstance(value, (str, Path)) else [str(p) for p in value]


def _split_by_file(name: str, directory: Path, suffix: str, val_frac: float, seed: int) -> dict:
    """One document per file (a book per book with gutenberg), the files split by a seeded permutation."""
    if not 0 <= val_frac < 1:
        raise ConfigError(f"--{name}-val-frac {val_frac}: must be in [0, 1), e.g. 0.1")
    paths = list_files(directory, suffix, name)
    for p in paths:
        if p.is_symlink() and not p.exists():
            read_bytes(p)  # the error names the link and what it points at
    names = [p.relative_to(directory).as_posix() for p in paths]
    split = split_by_file(names, val_frac, seed)
    read = set(paths)
    left_out = [{"path": portable(f), "reason": "a hidden file (its name starts with a dot)"
                 if any(part.startswith(".") for part in f.relative_to(directory).parts)
                 else f"{name} reads only {suffix} files; {READ_AS_TEXT}"}
                for f in files_under(directory, lambda f: f not in read, hidden=True)]
    return {"sources": [str(paths[i]) for i in split["train"]], "val_sources": [str(paths[i]) for i in split["val"]],
            "layout": NAMED[name].layout,
            "extra": {"split_rule": f"{FILE_SPLIT_RULE} (val_frac {val_frac}, seed {seed}; directory "
                                    f"{portable(directory)})", "skipped_inputs": left_out}}
