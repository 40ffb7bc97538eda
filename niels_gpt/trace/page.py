"""`trace ... --html OUT.html`: one self-contained page of a traced step (sequences, documents, origins)."""

from __future__ import annotations

import html
import json
from itertools import groupby

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
