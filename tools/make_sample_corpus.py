"""Cut the bundled sample corpus (niels_gpt/sources/sample/) from the real data in ../shared/data.

    python tools/make_sample_corpus.py [--data ../shared/data] [--out niels_gpt/sources/sample]

Deterministic: the same input files give the same output files (Parquet written without
statistics and with fixed settings; the pyarrow version is recorded in Parquet's `created_by`).
What is cut, and how each stand-in is made, is written to LICENSES.md next to the files.

- fineweb_edu/web-cc-sample.parquet: all 20 Dolma Common Crawl pages, mapped to fineweb-edu's
  11 columns (see FINEWEB_COLUMNS below for how each is filled).
- wikitext/wiki.train.raw, wiki.valid.raw: whole articles from wikitext-2-raw's validation file, in
  the raw line layout: the first articles up to WIKI_TRAIN_CHARS, then the next up to WIKI_VAL_CHARS.
- roam/*.md: stories I-IV of "The Adventures of Sherlock Holmes" cut into Roam-style notes.
- gutenberg/: two books copied byte for byte (header, footer, BOM and CRLF as in the originals).
- dolly15k/: the 34 Dolly records, copied.
- oasst1/: the first OASST_TREES trees of the nested export (copied lines) and the same messages as
  flat rows in the hub's column layout (Parquet), so both oasst1 code paths read real data.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
OUT = REPO / "niels_gpt" / "sources" / "sample"

WEB_FILES = ("dolma-test.cc_en_head-0091.jsonl", "dolma-test.cc_en_head-0174.jsonl")
WIKI_FILE = "wikitext-2-raw.wiki.valid.raw"
WIKI_TRAIN_CHARS = 600_000
WIKI_VAL_CHARS = 100_000
GUTENBERG_BOOKS = ("Alice-s-Adventures-in-Wonderland_11.txt", "Frankenstein_84.txt")
ROAM_BOOK = "The-Adventures-of-Sherlock-Holmes_1661.txt"
ROAM_STORIES = 4
ROAM_NOTE_CHARS = 6_000
DOLLY_FILE = "databricks-dolly-15k.first34.jsonl"
OASST_FILE = "oasst_pre_release.en_100_tree.jsonl"
OASST_TREES = 25

# fineweb-edu's edu classifier was not run on these pages: every row gets 3.0 / 3, the threshold
# at which fineweb-edu keeps a page, so filters written for fineweb-edu let them through.
EDU_SCORE = 3.0
# GPT-2's pre-tokenizer split, approximated with `re` (\w for \p{L}\p{N}): token_count is this piece
# count, a close lower bound of the GPT-2 token count fineweb-edu records.
PIECES = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+""")
FINEWEB_COLUMNS = {
    "text": "the page text, unchanged",
    "id": "<urn:uuid:UUID5(NAMESPACE_URL, url)> (fineweb uses the WARC record id, not in the source)",
    "dump": "the CC-MAIN-YYYY-WW crawl named in metadata.cc_segment",
    "url": "metadata.url",
    "date": "metadata.date_download",
    "file_path": "s3://commoncrawl/ + metadata.cc_segment (the WET file the page came from)",
    "language": "metadata.language",
    "language_score": "metadata.language_score",
    "token_count": "GPT-2 pre-tokenizer piece count (approximation, see PIECES)",
    "score": f"{EDU_SCORE} (classifier not run; fineweb-edu's inclusion threshold)",
    "int_score": f"{int(EDU_SCORE)}",
}


def write_parquet(rows: list[dict], schema, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, compression="zstd", write_statistics=False, use_dictionary=False)


def make_fineweb(data: Path, out: Path) -> dict:
    import pyarrow as pa

    rows = []
    for name in WEB_FILES:
        for line in (data / "web-cc-sample" / name).read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            m = r["metadata"]
            rows.append({
                "text": r["text"],
                "id": f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, m['url'])}>",
                "dump": re.search(r"CC-MAIN-\d{4}-\d{2}", m["cc_segment"]).group(0),
                "url": m["url"],
                "date": m["date_download"],
                "file_path": "s3://commoncrawl/" + m["cc_segment"],
                "language": m["language"],
                "language_score": float(m["language_score"]),
                "token_count": len(PIECES.findall(r["text"])),
                "score": EDU_SCORE,
                "int_score": int(EDU_SCORE),
            })
    schema = pa.schema([("text", pa.string()), ("id", pa.string()), ("dump", pa.string()),
                        ("url", pa.string()), ("date", pa.string()), ("file_path", pa.string()),
                        ("language", pa.string()), ("language_score", pa.float64()),
                        ("token_count", pa.int64()), ("score", pa.float64()), ("int_score", pa.int64())])
    (out / "fineweb_edu").mkdir(parents=True)
    write_parquet(rows, schema, out / "fineweb_edu" / "web-cc-sample.parquet")
    return {"documents": len(rows), "chars": sum(len(r["text"]) for r in rows)}


def make_wikitext(data: Path, out: Path) -> dict:
    raw = (data / "wikitext" / WIKI_FILE).read_bytes().decode("utf-8")
    lines = raw.split("\n")
    heads = [i for i, ln in enumerate(lines)
             if ln.strip().startswith("= ") and ln.strip().endswith(" =") and not ln.strip().startswith("= =")]
    # Each article keeps the blank " " line before its heading, as in the original layout.
    starts = [h - 1 for h in heads] + [len(lines) - 1]
    parts, i, stats = {}, 0, {}
    for split, budget in (("train", WIKI_TRAIN_CHARS), ("valid", WIKI_VAL_CHARS)):
        chunk, n = [], 0
        while i < len(heads) and sum(len(x) + 1 for x in chunk) < budget:
            chunk.extend(lines[starts[i]:starts[i + 1]])
            i, n = i + 1, n + 1
        parts[split] = "\n".join(chunk) + "\n"
        stats[split] = {"articles": n, "lines": len(chunk), "chars": len(parts[split])}
    (out / "wikitext").mkdir(parents=True)
    for split, text in parts.items():
        (out / "wikitext" / f"wiki.{split}.raw").write_bytes(text.encode("utf-8"))
    return stats


def _title(heading: str) -> str:
    words = heading.split(". ", 1)[1].lower().split()
    small = {"a", "an", "the", "in", "of", "and"}
    return " ".join(w if (w in small and k) else w.capitalize() for k, w in enumerate(words))


def make_roam(data: Path, out: Path) -> dict:
    raw = (data / "gutenberg" / ROAM_BOOK).read_bytes().decode("utf-8-sig").replace("\r\n", "\n")
    heads = list(re.finditer(r"^ADVENTURE [IVX]+\. .+$", raw, re.MULTILINE))
    (out / "roam").mkdir(parents=True)
    notes, chars = 0, 0
    for k in range(ROAM_STORIES):
        title = _title(heads[k].group(0))
        body = raw[heads[k].end():heads[k + 1].start()]
        # A paragraph becomes one Roam block: hard line wraps joined, chapter numerals dropped.
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body)]
        paras = [p for p in paras if p and not re.fullmatch(r"[IVX]+\.", p)]
        groups, cur = [], []
        for p in paras:
            cur.append(p)
            if sum(len(x) for x in cur) >= ROAM_NOTE_CHARS:
                groups.append(cur)
                cur = []
        if cur:
            groups.append(cur)
        for j, group in enumerate(groups, start=1):
            name = f"{title} ({j})"
            head = [f"- tags:: #[[Sherlock Holmes]] [[{title}]]",
                    f"- part {j} of {len(groups)}"
                    + (f", next: [[{title} ({j + 1})]]" if j < len(groups) else "")]
            text = "\n".join(head + [f"- {p}" for p in group]) + "\n"
            (out / "roam" / f"{name}.md").write_bytes(text.encode("utf-8"))
            notes, chars = notes + 1, chars + len(text)
    return {"notes": notes, "chars": chars}


def make_oasst(data: Path, out: Path) -> dict:
    import pyarrow as pa

    lines = (data / "oasst1" / OASST_FILE).read_bytes().split(b"\n")[:OASST_TREES]
    (out / "oasst1").mkdir(parents=True)
    (out / "oasst1" / "oasst1-trees.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    rows = []
    for line in lines:
        tree = json.loads(line)
        stack = [(tree["prompt"], None)]
        while stack:  # depth-first, parents before children, replies in file order
            msg, parent = stack.pop()
            rank = msg.get("rank")
            rows.append({
                "message_id": msg["message_id"], "parent_id": parent, "text": msg["text"],
                "role": msg["role"], "lang": msg["lang"], "review_count": msg["review_count"],
                "review_result": msg["review_result"], "deleted": msg["deleted"],
                "rank": None if rank is None else float(rank), "synthetic": msg["synthetic"],
                "model_name": msg.get("model_name"), "message_tree_id": tree["message_tree_id"],
                "tree_state": tree["tree_state"],
            })
            stack.extend((r, msg["message_id"]) for r in reversed(msg["replies"]))
    schema = pa.schema([("message_id", pa.string()), ("parent_id", pa.string()), ("text", pa.string()),
                        ("role", pa.string()), ("lang", pa.string()), ("review_count", pa.int32()),
                        ("review_result", pa.bool_()), ("deleted", pa.bool_()), ("rank", pa.float64()),
                        ("synthetic", pa.bool_()), ("model_name", pa.string()),
                        ("message_tree_id", pa.string()), ("tree_state", pa.string())])
    write_parquet(rows, schema, out / "oasst1" / "oasst1-rows.parquet")
    return {"trees": len(lines), "messages": len(rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help=f"real data directory (default {DATA})")
    ap.add_argument("--out", type=Path, default=OUT, help=f"sample directory to (re)write (default {OUT})")
    args = ap.parse_args(argv)
    out: Path = args.out
    licences = (out / "LICENSES.md").read_bytes() if (out / "LICENSES.md").exists() else None
    for sub in ("fineweb_edu", "wikitext", "roam", "gutenberg", "dolly15k", "oasst1"):
        shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "fineweb_edu": make_fineweb(args.data, out),
        "wikitext": make_wikitext(args.data, out),
        "roam": make_roam(args.data, out),
    }
    (out / "gutenberg").mkdir()
    for book in GUTENBERG_BOOKS:
        shutil.copyfile(args.data / "gutenberg" / book, out / "gutenberg" / book)
    (out / "dolly15k").mkdir()
    shutil.copyfile(args.data / "dolly-15k" / DOLLY_FILE, out / "dolly15k" / DOLLY_FILE)
    report["oasst1"] = make_oasst(args.data, out)
    if licences is not None:  # LICENSES.md is written by hand; keep it
        (out / "LICENSES.md").write_bytes(licences)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
