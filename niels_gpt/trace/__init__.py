"""Which documents were in step N: `trace_step`, `trace_document` (the reverse), `document_origin`, the page.

    from niels_gpt.trace import trace_step, trace_document
    trace_step("runs/demo", 41)["sequences"][0]["documents"]   # origin, sequence_tokens, trained_tokens
    trace_document("runs/demo", "train:11")["steps"]           # [{step, rank, micro_batch, row, sample}]

See docs/trace.md.
"""

from niels_gpt.lazy import lazy_names

# NOTE: imported on first use (PEP 562): the trace replays the run's sampler, which imports torch (~1 s), and
# `trace --help` needs none of it
_HOMES = {"document_origin": "documents", "trace_document": "reverse", "trace_state": "steps", "trace_step": "steps"}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_names(globals(), _HOMES)
