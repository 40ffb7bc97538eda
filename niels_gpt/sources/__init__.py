"""Text and chat sources: lazy iterators of `str` documents (pretraining) or `list[Message]` (SFT).

    from niels_gpt.sources import fineweb_edu, roam, sample_sources
    for doc in roam("exports/roam").iter_texts("train"): ...
    srcs = sample_sources()                     # every source on the bundled sample corpus
    srcs["oasst1"].iter_conversations()         # -> [{"role": "user", ...}, {"role": "assistant", ...}]

| source      | reads                                   | split                            |
|-------------|-----------------------------------------|----------------------------------|
| fineweb_edu | hub stream (or local parquet/jsonl)     | none (builder splits by budget)  |
| wikitext    | hub rows (or raw/parquet files)         | dataset's train / validation     |
| roam        | directory of .md, one doc per file      | seeded permutation of file names |
| gutenberg   | directory of PG .txt, licence cut off   | seeded permutation of file names |
| dolly15k    | hub (or jsonl/parquet)                  | none (SFT builder splits)        |
| oasst1      | hub flat rows, local rows, nested JSONL | none (SFT builder splits)        |

Nothing heavy is imported here: `datasets` and `torch` load when a source is first iterated or split.
Every skipped record is counted in `source.skipped` and reported by `source.describe()`.
"""

from __future__ import annotations

from niels_gpt.sources.base import SAMPLE_DIR, ChatSource, TextSource, split_by_file
from niels_gpt.sources.dolly import dolly15k
from niels_gpt.sources.files import gutenberg, roam, strip_gutenberg
from niels_gpt.sources.oasst import oasst1
from niels_gpt.sources.text import fineweb_edu
from niels_gpt.sources.wikitext import rebuild_articles, wikitext

__all__ = [
    "SAMPLE_DIR", "ChatSource", "TextSource", "dolly15k", "fineweb_edu", "gutenberg",
    "oasst1", "rebuild_articles", "roam", "sample_sources", "split_by_file", "strip_gutenberg",
    "wikitext",
]


def sample_sources(seed: int = 42) -> dict[str, TextSource | ChatSource]:
    """Every source pointed at the bundled sample corpus (offline; see sample/LICENSES.md).

    Pretraining: fineweb_edu, wikitext, roam, gutenberg. SFT: dolly15k, oasst1 (the flat-row
    Parquet, the hub's code path; `sample/oasst1/oasst1-trees.jsonl` holds the same trees nested).
    """
    s = SAMPLE_DIR
    return {
        "fineweb_edu": fineweb_edu(data_files=s / "fineweb_edu" / "web-cc-sample.parquet", seed=seed),
        "wikitext": wikitext(data_files={"train": s / "wikitext" / "wiki.train.raw",
                                         "validation": s / "wikitext" / "wiki.valid.raw"}),
        "roam": roam(s / "roam", seed=seed),
        "gutenberg": gutenberg(s / "gutenberg", seed=seed),
        "dolly15k": dolly15k(data_files=s / "dolly15k" / "databricks-dolly-15k.first34.jsonl"),
        "oasst1": oasst1(data_files=s / "oasst1" / "oasst1-rows.parquet"),
    }
