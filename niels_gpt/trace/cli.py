"""`trace`: which documents were in step N of a run, or which steps saw a document.

    niels-gpt-data trace runs/demo --step 41 [--rank 0] [--text] [--json] [--html step41.html]
    niels-gpt-data trace runs/demo --document train:11 [--json]

`--html OUT.html` writes one self-contained page of a traced step (sequences, documents, origins).
"""

from __future__ import annotations

import html
import json
import sys
from itertools import groupby
from pathlib import Path

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser("trace")
    p.add_argument("run_dir", help="the run directory (train's --out-dir)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--step", type=int, help="the step to trace (1 = the first, as the step log counts; default: none, give "
                      "--step or --document)")
    what.add_argument("--document", metavar="ID", help="the steps that saw this document: SPLIT:INDEX (e.g. train:11), "
                      "DATASET:SPLIT:INDEX in a mixture, rankR:INDEX for Parquet shards, or the document's origin INPUT:RECORD "
                      "(e.g. data/a.jsonl:17: line 17 of that input; a row of a Parquet file) (default: none)")
    p.add_argument("--rank", type=int, default=None, help="only this rank's sequences (default: every rank)")
    p.add_argument("--text", action="store_true", help="print each document's decoded text")
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    p.add_argument("--html", metavar="OUT.html", default=None, help="write a page of the step (one self-contained file; default: none)")
    p.add_argument("--data", default=None, help="where the run's data is now, if it moved (default: as the run records)")
    p.add_argument("--tokenizer", default=None, help="tokenizer for --text/--html (default: the run's, else the data's)")
    p.set_defaults(func=run_trace)


def _decoder(trace: dict, run_dir: str, explicit: str | None):
    import torch

    # lazy: the tokenizer and the trainer's modules import torch, which building the parser must not
    from niels_gpt.tokenizer import load_tokenizer
    from niels_gpt.train import checkpoint, setup

    if explicit:
        return load_tokenizer(explicit).decode
    recorded = torch.load(checkpoint.latest_checkpoint(run_dir), map_location="cpu", weights_only=True,
                          mmap=True).get("tokenizer")
    if recorded and Path(recorded).exists():
        return load_tokenizer(recorded).decode
    first = trace["sequences"][0]["documents"][0] if trace["sequences"] and trace["sequences"][0]["documents"] else {}
    for where in (first.get("cache"), first.get("source_cache"), trace["data"]):
        tok = setup.find_tokenizer(where) if where else None
        if tok is not None:
            return tok.decode
    raise ConfigError(f"{run_dir}: no tokenizer found for --text/--html (the run records none that exists, nor does "
                      f"its data {trace['data']}); pass --tokenizer")


def _describe(doc: dict) -> str:
    where = (f"bin {doc['bin']} tokens {doc['bin_tokens'][0]}..{doc['bin_tokens'][1]}" if "bin" in doc
             else f"tokens {doc['cache_tokens'][0]}..{doc['cache_tokens'][1]}")
    source = f"input {doc['input']}" if doc.get("input") else doc.get("note", "")
    if doc.get("where"):  # the cache records each document's origin (builders/origins.py)
        chars = doc.get("chars")
        source = f"from {doc['where']}" + (f", characters {chars[0]}..{chars[1] if chars[1] is not None else ''}"
                                            if chars else "")
    if doc.get("message_ids"):  # an oasst example: its tree and its messages, the last one the leaf
        source += f", tree {doc['message_tree_id']}, messages {' '.join(doc['message_ids'])}"
    return f"{_name(doc)} ({where} of {doc['cache']}; {source})"


def run_trace(args) -> int:
    # lazy: imports torch, which building the parser must not
    from niels_gpt.trace import trace_document, trace_step
    from niels_gpt.trace.documents import record_text

    if args.document is not None:
        if args.rank is not None or args.text or args.html:
            raise ConfigError("--document lists steps: --rank, --text and --html go with --step")
        found = trace_document(args.run_dir, args.document, data=args.data)
        if args.json:
            print(json.dumps(found))
            return 0
        print(f"{args.document}: {_describe(found['origin'])}; in {len(found['steps'])} sequence(s) of {args.run_dir}")
        for h in found["steps"]:
            print(f"step {h['step']} rank {h['rank']} micro-batch {h['micro_batch']} row {h['row']} (sample {h['sample']})")
        return 0
    trace = trace_step(args.run_dir, args.step, rank=args.rank, data=args.data)
    decode = _decoder(trace, args.run_dir, args.tokenizer) if (args.text or args.html) else None
    if args.html:
        write_bytes_atomic(Path(args.html), render_page(trace, decode).encode("utf-8"))
        print(f"wrote {args.html}: {len(trace['sequences'])} sequences of step {trace['step']}", file=sys.stderr)
        if not (args.json or args.text):
            return 0
    if args.json:
        if decode is not None and args.text:
            for seq in trace["sequences"]:
                for doc in seq["documents"]:
                    a, b = doc["sequence_tokens"]
                    doc["text"] = decode(seq["input_ids"][a:b])
        print(json.dumps(trace))
        return 0
    print(f"step {trace['step']} of {trace['run']}: {trace['kind']} data {trace['data']}, {trace['world_size']} rank(s) "
          f"x {trace['micro_batches']} micro-batch(es) of {trace['sequence_len']} tokens a row "
          f"(replayed from {trace['replayed_from']})")
    for seq in trace["sequences"]:
        print(f"rank {seq['rank']} micro-batch {seq['micro_batch']} row {seq['row']} (sample {seq['sample']}):")
        for doc in seq["documents"]:
            a, b = doc["sequence_tokens"]
            print(f"  [{a}:{b}) {_describe(doc)}, {doc['trained_tokens']} of {b - a} trained")
            if decode is not None and args.text:
                print("    " + repr(decode(seq["input_ids"][a:b])))
                if doc.get("chars") and "bin" not in doc:  # the record's text of the document, read again
                    text = record_text(doc["cache"], doc["split"], doc["document"])
                    if text is not None:
                        print(f"    record {doc['where']}, characters {doc['chars'][0]}..{doc['chars'][1]}: "
                              f"{text[:200]!r}{' ...' if len(text) > 200 else ''}")
    return 0


STYLE = """
body{font-family:system-ui,sans-serif;margin:0;display:flex}
main{flex:3;padding:1em;overflow:auto}aside{flex:1;padding:1em;background:#f4f4f4;font-size:12px;overflow:auto;
max-height:100vh}
.sequence{border:1px solid #ccc;margin:0 0 1em;padding:.5em;white-space:pre-wrap;font-family:monospace;font-size:12px}
.sequence h2{font:bold 12px system-ui;margin:0 0 .3em}
.doc{border-left:3px solid #333;padding-left:2px}.d0{background:#e3f0ff}.d1{background:#fff1d6}.d2{background:#e5f7e5}
.untrained{color:#999}
"""


def _name(doc: dict) -> str:
    where = f"{doc['dataset']}:" if doc.get("dataset") else ""
    return f"{where}{doc['split']}:{doc['document']}"


def render_page(trace: dict, decode) -> str:
    """The page of `trace` (trace_step's result); decode(ids) -> text."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>step {trace['step']} of "
             f"{html.escape(trace['run'])}</title><style>{STYLE}</style></head><body><main>",
             f"<h1>Step {trace['step']} of {html.escape(trace['run'])}</h1><p>{html.escape(trace['kind'])} data "
             f"{html.escape(str(trace['data']))}, {trace['world_size']} rank(s) x {trace['micro_batches']} "
             f"micro-batch(es); greyed tokens were not trained</p>"]
    origins: dict[str, dict] = {}
    for seq in trace["sequences"]:
        parts.append(f"<section class='sequence' data-rank='{seq['rank']}' data-micro-batch='{seq['micro_batch']}' "
                     f"data-row='{seq['row']}'><h2>rank {seq['rank']}, micro-batch {seq['micro_batch']}, row "
                     f"{seq['row']} (sample {html.escape(json.dumps(seq['sample']))})</h2>")
        for n, doc in enumerate(seq["documents"]):
            a, b = doc["sequence_tokens"]
            origins.setdefault(_name(doc), doc)
            body = ""
            pieces = zip(seq["input_ids"][a:b], seq["trained"][a:b], strict=True)
            for ok, run in groupby(pieces, key=lambda t: t[1]):  # runs of trained and untrained tokens
                text = html.escape(decode([i for i, _ in run]))
                body += text if ok else f"<span class='untrained'>{text}</span>"
            title = json.dumps({k: v for k, v in doc.items() if k != "trained_tokens"}, default=str)
            parts.append(f"<span class='doc d{n % 3}' data-document='{html.escape(_name(doc))}' "
                         f"title='{html.escape(title)}'>{body}</span>")
        parts.append("</section>")
    parts.append("</main><aside><h2>Documents</h2><ul>")
    for name, doc in origins.items():
        source = doc.get("where") or doc.get("input") or doc.get("note") or ""  # where: input and record
        parts.append(f"<li class='origin' data-document='{html.escape(name)}'><b>{html.escape(name)}</b> tokens "
                     f"{html.escape(str(doc.get('cache_tokens') or doc.get('bin_tokens')))} of "
                     f"{html.escape(str(doc['cache']))}<br>{html.escape(str(source))}</li>")
    parts.append("</ul></aside></body></html>\n")
    return "".join(parts)
