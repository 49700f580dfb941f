"""bart_opt: a memory-optimized BART; with `exact=True` it generates exactly what transformers generates."""

from bart_opt.errors import InvalidRequest
from bart_opt.model import Bart
from bart_opt.spec import GenerationSpec

__all__ = ["Bart", "GenerationSpec", "InvalidRequest", "Summarizer"]


def __getattr__(name):
    # The pipeline pulls in tokenizers and ROUGE; load it only when asked for.
    if name == "Summarizer":
        from bart_opt.summarizer import Summarizer

        return Summarizer
    raise AttributeError(f"module 'bart_opt' has no attribute {name!r}")
