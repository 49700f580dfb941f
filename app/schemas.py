"""Request and response bodies of the HTTP API (pydantic models, shown in /docs)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, WithJsonSchema, create_model,
    field_validator,
)

from bart_opt.pipeline.rouge_text import TOKENIZERS
from bart_opt.engine.spec import EARLY_STOPPING, REQUEST_OPTIONS

RougeScores = dict[str, dict[str, float]]
"""Per-item ROUGE: ``{"rouge1": {"precision", "recall", "fmeasure"}, ...}`` on a 0-100 scale."""

RougeAggregate = dict[str, dict[str, dict[str, float]]]
"""Bootstrap aggregate: ``{"rouge1": {"low": {...}, "mid": {...}, "high": {...}}, ...}``."""


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("text is empty")
    return text


def _reference_not_blank(reference: str) -> str:
    # The rule of jobs and the CLI ("column 'reference' is empty"): ROUGE against nothing is 0, which would
    # pull the request's aggregate down as if the summary were wrong (issue 40: R1 86.8 -> 43.4 with one such reference).
    if not reference or reference.isspace():
        raise ValueError("reference is empty (or only white space), and ROUGE against it would be 0; give the "
                         "text's reference summary, or send no references to get summaries alone")
    return reference


def _early_stopping(value: object) -> bool | str:
    if isinstance(value, bool) or value == "never":
        return value
    raise ValueError('must be true, false or "never"')


class OptionView(BaseModel):
    """One generation option a request may set (`bart_opt.engine.spec.REQUEST_OPTIONS`): ``type`` is
    ``integer`` (at least ``minimum``), ``number`` or ``choice`` (one of ``choices``)."""

    name: str
    label: str
    description: str
    type: str
    minimum: int | None = None
    choices: list[bool | str] | None = None


class Options(BaseModel):
    """``GET /options``: the generation options requests and jobs take, in order."""

    generation: list[OptionView]

    @classmethod
    def of_spec(cls) -> Options:
        kinds = {"count": "integer", "number": "number", "early_stopping": "choice"}
        return cls(generation=[
            OptionView(name=name, label=option.label, description=option.help, type=kinds[option.kind],
                       minimum=option.minimum,
                       choices=list(EARLY_STOPPING) if option.kind == "early_stopping" else None)
            for name, option in REQUEST_OPTIONS.items()
        ])


# One type with one error message (a union would report one error per member, under odd field paths).
EarlyStopping = Annotated[
    bool | str, PlainValidator(_early_stopping), WithJsonSchema({"anyOf": [{"type": "boolean"}, {"const": "never"}]})
]


class _GenerationOptions(BaseModel):
    """Per-request overrides of the checkpoint's generation defaults (null or absent: the default).

    Only JSON types are checked here, strictly (``"4"`` or ``true`` is not a number); the values
    and every rule between them are checked once, by `bart_opt.GenerationSpec.resolve`, whose
    error comes back as a 422 naming the option. Lengths count the decoder start token, as in
    transformers; ``max_new_tokens`` / ``min_new_tokens`` take precedence over ``max_length`` /
    ``min_length`` (transformers 5's semantics). The options are `bart_opt.engine.spec.REQUEST_OPTIONS`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    def overrides(self) -> dict:
        """The options the client set, as keyword arguments for generation."""
        return self.model_dump(exclude_none=True)


_OPTION_TYPES = {"count": int, "number": float, "early_stopping": EarlyStopping}
GenerationOptions = create_model(
    "GenerationOptions", __base__=_GenerationOptions, __doc__=_GenerationOptions.__doc__, __module__=__name__,
    **{name: (_OPTION_TYPES[option.kind] | None, Field(None, description=option.help))
       for name, option in REQUEST_OPTIONS.items()},
)


class RougeOptions(BaseModel):
    """A job's ROUGE settings (absent or null: the server's ``BART_OPT_ROUGE_TOKENIZER`` / ``BART_OPT_ROUGE_LANG``),
    checked once by `bart_opt.pipeline.rouge.RougeSettings` (a 422 naming ``rouge.tokenizer`` or ``rouge.lang``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tokenizer: Literal[TOKENIZERS] | None = Field(  # type: ignore[valid-type]
        None, description="default (rouge-score's: a-z and 0-9 only), unicode (Unicode words) or script (Unicode "
        "words, and the characters of scripts written without spaces: Chinese, Japanese, Thai)")
    lang: str | None = Field(None, min_length=2, max_length=3, description="ISO 639-1 code of the texts' language "
                             "(its stemmer and rougeLsum sentence splitting), e.g. ru, zh, ar; mul for several")


class SummarizeRequest(BaseModel):
    """``POST /summarize`` body. Types are strict: nothing is coerced (a number is not a text)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "texts": ["The city council voted on Monday to approve the new budget after a long debate."],
        "references": ["Council approves the budget."],
        "generation": {"num_beams": 2, "min_length": 4, "max_length": 20},
    }]})  # fmt: skip

    texts: list[Annotated[str, AfterValidator(_not_blank), WithJsonSchema({"type": "string", "minLength": 1})]] = Field(
        description="Articles to summarize (at least one, none blank; at most MAX_TEXTS).",
        json_schema_extra={"minItems": 1},
    )
    references: list[Annotated[str, AfterValidator(_reference_not_blank), WithJsonSchema(
        {"type": "string", "minLength": 1})]] | None = Field(
        None, description="Reference summaries, one per text (none blank, as in jobs and the CLI); ROUGE is scored "
        "when given."
    )
    generation: GenerationOptions | None = Field(None, description="Overrides of the generation defaults.")

    @field_validator("texts")
    @classmethod
    def _some_texts(cls, texts: list[str]) -> list[str]:
        if not texts:
            raise ValueError("must contain at least one text")
        return texts

    @field_validator("references")
    @classmethod
    def _one_reference_per_text(cls, references: list[str] | None, info: ValidationInfo) -> list[str] | None:
        texts = info.data.get("texts")
        if references is not None and texts is not None and len(references) != len(texts):
            raise ValueError(f"got {len(references)} references for {len(texts)} texts; give one per text")
        return references


class ItemReport(BaseModel):
    """What happened to one text."""

    input_tokens: int
    truncated: bool
    output_tokens: int
    rouge: RougeScores | None = None
    error: str | None = Field(None, description="Why this text has no summary (out of memory even alone).")


class PhaseReport(BaseModel):
    """One phase of the model call (encode, decode, ...), this request's share."""

    name: str
    count: int = 1
    seconds: float
    peak_bytes: int


class MemoryRow(BaseModel):
    """One reading of the model call's memory log (one per decoder step): seconds since the call
    began, device memory now and its peak since the previous reading, both above the call's start."""

    t: float
    mem_bytes: int
    peak_bytes: int


class BatchInfo(BaseModel):
    """The shared model call this request rode in (whole-call numbers, not shares)."""

    requests: int
    texts: int
    peak_bytes: int
    seconds: float


class MemoryReport(BaseModel):
    """Per-request memory report: this request's share of the model call it was batched into.

    ``peak_bytes``, ``change_bytes``, ``seconds`` and the phases are the call's numbers times
    ``share`` (this request's part of the call's input tokens); ``batch`` holds
    the call's own numbers. ``rss_bytes`` is the process RSS after the call.
    """

    device: str
    peak_bytes: int
    change_bytes: int
    rss_bytes: int
    seconds: float
    phases: list[PhaseReport]
    rows: list[MemoryRow] = Field(
        default_factory=list, description="The whole call's readings, one per decoder step (at most 256, evenly "
        "thinned; not scaled to the request's share).",
    )
    peak_source: str
    share: float
    batch: BatchInfo


class Timing(BaseModel):
    """Seconds. ``queue``, ``score`` and ``total`` (wall time in the service) are this request's own;
    ``tokenize``, ``generate`` and ``decode`` are its share of the model call."""

    queue: float
    tokenize: float
    generate: float
    decode: float
    score: float
    total: float


class SummarizeResponse(BaseModel):
    """``POST /summarize`` answer."""

    summaries: list[str]
    rouge: RougeAggregate | None
    items: list[ItemReport]
    memory: MemoryReport
    timing: Timing
    model: str
    generation: dict = Field(description="The generation settings that ran (checkpoint defaults + overrides, resolved).")
    request_id: str


class StaticGraphs(BaseModel):
    """The static search's CUDA graphs on the loaded model (`bart_opt.engine.graphs.StepGraphs`)."""

    graphs: int = Field(description="Graphs held (at most bart_opt.engine.graphs.MAX_GRAPHS).")
    captures: int = Field(description="Graphs captured since the model loaded.")
    capture_s: float = Field(description="Seconds spent capturing them.")
    pool_bytes: int = Field(description="Device memory the captures reserved for the graphs' shared pool.")
    buffers_bytes: int = Field(description="Device memory of the persistent buffers the graphs read.")


class DeviceMemory(BaseModel):
    """Device memory now and at its peak (CUDA allocator; on CPU the weights), the weights' bytes
    (None before the model is loaded), the process RSS, and the static search's graphs (None without)."""

    device: str | None
    allocated_bytes: int
    peak_bytes: int
    rss_bytes: int
    weights_bytes: int | None
    static_graphs: StaticGraphs | None = None


class RequestsNow(BaseModel):
    """HTTP requests being handled now."""

    in_flight: int


class Latency(BaseModel):
    """One route's request latency, in seconds, estimated from the latency histogram's buckets."""

    count: int
    mean_s: float
    p50: float
    p90: float
    p99: float


class QueueState(BaseModel):
    """Work items waiting per kind, the interactive queue's capacity and the worker's state."""

    waiting: dict[str, int]
    capacity: int
    state: str


class MetricsSnapshot(BaseModel):
    """``GET /metrics?format=json``: memory, requests in flight, latency per route, the queue and the
    last requests' memory/timing logs."""

    memory: DeviceMemory
    requests: RequestsNow
    latency: dict[str, Latency]
    queue: QueueState
    recent: list[dict]
