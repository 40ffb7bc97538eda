"""Which documents were in step N: `trace_step`, `trace_document` (the reverse), `document_origin`, the page.

    from niels_gpt.trace import trace_step, trace_document
    trace_step("runs/demo", 41)["sequences"][0]["documents"]   # origin, sequence_tokens, trained_tokens
    trace_document("runs/demo", "train:11")["steps"]           # [{step, rank, micro_batch, row, sample}]

See docs/trace.md.
"""

from niels_gpt.trace.documents import document_origin
from niels_gpt.trace.reverse import trace_document
from niels_gpt.trace.steps import trace_state, trace_step

__all__ = ["document_origin", "trace_document", "trace_state", "trace_step"]
