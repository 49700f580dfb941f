"""bart_opt: a memory-optimized BART; with `exact=True` it generates exactly what transformers generates."""

from importlib.metadata import PackageNotFoundError, version

from bart_opt.errors import InvalidRequest
from bart_opt.engine.spec import GenerationSpec

try:
    __version__ = version("bart-opt")  # the one version: pyproject's, through the package metadata
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Bart", "GenerationSpec", "InvalidRequest", "Summarizer", "__version__"]


def __getattr__(name):
    # The model pulls in torch and the pipeline tokenizers and ROUGE: load them only when asked for,
    # so that `bart-opt --help` and `--version` start without torch.
    if name == "Bart":
        from bart_opt.engine.model import Bart

        return Bart
    if name == "Summarizer":
        from bart_opt.pipeline.summarizer import Summarizer

        return Summarizer
    raise AttributeError(f"module 'bart_opt' has no attribute {name!r}")
