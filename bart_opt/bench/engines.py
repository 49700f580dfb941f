"""The engines ``bart-opt bench --peers`` runs side by side, behind one small interface.

Every engine loads the same checkpoint folder and turns the same documents (token ids, bos ...
eos, unpadded) into one list of ids per document, laid out as transformers' ``generate`` lays a
row out minus its padding: the decoder start token, the generated tokens, the end token.

- ``transformers``: ``BartForConditionalGeneration.generate`` on the batch padded to its longest
  document (the reference);
- ``bart_opt``: :class:`bart_opt.Bart` on the same padded batch;
- ``ctranslate2``: a ``ctranslate2.Translator`` over the checkpoint converted once (float32)
  and loaded with ``compute_type`` float32 or int8 (weights quantized at load time).

Generation settings are resolved once into a :class:`bart_opt.GenerationSpec` for every engine,
so the checkpoint's generation config and the bench's overrides mean the same thing everywhere;
CTranslate2 gets them through :func:`ct2_options`.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch

from bart_opt.engine.spec import GenerationSpec

@dataclass(frozen=True)
class EngineSpec:
    """One engine at one precision: ``name`` in transformers, bart_opt, bart_opt_fast (its fast mode), ctranslate2."""

    name: str
    dtype: str  # float32, bfloat16, float16 (torch engines); int8, int8+bfloat16 (bart_opt); float32, int8 (ctranslate2)

    @property
    def label(self) -> str:
        return f"{self.name} {self.dtype}"

    @property
    def quantize(self) -> str | None:
        """bart_opt's `quantize` argument: "int8" for the dtypes int8 and int8+<float dtype>, else None."""
        return "int8" if self.dtype.split("+")[0] == "int8" and self.name != "ctranslate2" else None

    @property
    def float_dtype(self) -> torch.dtype:
        """The torch dtype of everything not quantized: float32 under plain int8, the named one otherwise."""
        name = self.dtype.split("+")[-1]
        return torch.float32 if name == "int8" else getattr(torch, name)


def checkpoint_settings(folder: str, generation_kwargs: dict) -> GenerationSpec:
    """The generation settings every engine uses: the checkpoint's generation config plus overrides."""
    from transformers import BartConfig, GenerationConfig

    return GenerationSpec.resolve(BartConfig.from_pretrained(folder), GenerationConfig.from_pretrained(folder),
                                  generation_kwargs)


def trim_row(row: list[int], settings: GenerationSpec) -> list[int]:
    """One row of transformers' padded output up to and including its end token."""
    eos = set(settings.eos_token_id or ())
    for i in range(1, len(row)):
        if row[i] in eos:
            return row[: i + 1]
    end = len(row)
    while end > 1 and row[end - 1] == settings.pad_token_id:
        end -= 1
    return row[:end]


def pad_batch(docs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, T) and attention mask (B, T), T the longest document."""
    longest = max(len(d) for d in docs)
    ids = torch.full((len(docs), longest), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(docs), longest), dtype=torch.long)  # (B, T)
    for row, doc in enumerate(docs):
        ids[row, : len(doc)] = torch.tensor(doc)
        mask[row, : len(doc)] = 1
    return ids, mask


class TorchEngine:
    """transformers or bart_opt: one ``generate`` call on the padded batch."""

    def __init__(self, spec: EngineSpec, folder: str, generation_kwargs: dict):
        self.spec = spec
        self.settings = checkpoint_settings(folder, generation_kwargs)
        self.kwargs = generation_kwargs
        dtype = spec.float_dtype
        if spec.name == "transformers":
            from transformers import BartForConditionalGeneration

            self.model = BartForConditionalGeneration.from_pretrained(folder, dtype=dtype).eval()
        else:
            from bart_opt import Bart

            self.model = Bart.from_pretrained(folder, dtype=dtype, fast=spec.name == "bart_opt_fast",
                                              quantize=spec.quantize).eval()
        self.batch = None

    def prepare(self, docs: list[list[int]]) -> None:
        """Build the padded input tensors once, outside the timed calls."""
        self.batch = pad_batch(docs, self.model.config.pad_token_id)

    @torch.inference_mode()
    def generate(self) -> list[list[int]]:
        ids, mask = self.batch
        if self.spec.name == "transformers":
            out = self.model.generate(input_ids=ids, attention_mask=mask, **self.kwargs)
        else:
            out = self.model.generate(ids, attention_mask=mask, **self.kwargs)
        return [trim_row(row, self.settings) for row in out.tolist()]


def ct2_length_limits(min_length: int, max_length: int, forced_eos: bool) -> dict[str, int]:
    """transformers' length limits as CTranslate2's, so that both allow the same output lengths.

    transformers counts the decoder start token in ``min_length``/``max_length``: the end token may
    come once ``min_length`` tokens exist, and at most ``max_length - 1`` tokens follow the start
    token, the last forced to the end token when ``forced_eos_token_id`` is set. CTranslate2 counts
    the hypothesis without the start token but with the target prefix (the forced BOS) and the end
    token: measured with CTranslate2 4.8.5, the end token may come once ``min_decoding_length``
    tokens exist and a hypothesis has at most ``max_decoding_length`` tokens, the end token included;
    one that reaches the limit stops without an end token (nothing is forced). Hence
    ``min_decoding_length = min_length - 1`` and ``max_decoding_length = max_length - 1``, or
    ``max_length - 2`` with forced EOS, whose end token :func:`ct2_ids` appends (passing
    ``min_length``/``max_length`` unchanged would allow outputs one and two tokens longer).
    """
    return {"min_decoding_length": max(min_length - 1, 0),
            "max_decoding_length": max_length - (2 if forced_eos else 1)}


def ct2_token(token_id: int) -> str:
    """The token string standing for `token_id` in the converted model's vocabulary."""
    return f"id{token_id}"


def ct2_options(settings: GenerationSpec) -> dict:
    """``translate_batch`` keyword arguments equivalent to transformers' settings (beam size 1 is greedy).

    transformers' ``early_stopping`` has no counterpart: CTranslate2 stops an input once it has
    ``beam_size`` finished hypotheses (patience 1), which is ``early_stopping=True``.
    """
    options = {
        "beam_size": settings.num_beams, "length_penalty": settings.length_penalty,
        "no_repeat_ngram_size": settings.no_repeat_ngram_size, "return_end_token": True,
        "max_input_length": 0,  # never truncate: the inputs already fit the model
        **ct2_length_limits(settings.min_length, settings.max_length, settings.forced_eos_token_id is not None),
    }
    if settings.eos_token_id is not None:
        options["end_token"] = [ct2_token(t) for t in settings.eos_token_id]
    return options


def ct2_ids(hypothesis: list[str], settings: GenerationSpec) -> list[int]:
    """A CTranslate2 hypothesis as transformers lays the row out: start token, tokens, end token.

    A hypothesis stopped by ``max_decoding_length`` has no end token; transformers' forced EOS would
    have put one there, so it is appended when ``forced_eos_token_id`` is set.
    """
    ids = [int(token[2:]) for token in hypothesis]
    eos = settings.eos_token_id or []
    if settings.forced_eos_token_id is not None and (not ids or ids[-1] not in eos):
        ids.append(settings.forced_eos_token_id[0])
    return [settings.decoder_start_token_id, *ids]


class _IdVocabulary:
    """What CTranslate2's BART converter asks of a tokenizer, with ``id<N>`` as token N's string.

    The converter only needs the vocabulary as strings; naming every id keeps ids and strings
    one-to-one for any checkpoint, with or without a tokenizer, so inputs and outputs are ids.
    """

    def __init__(self, config):
        self.size = config.vocab_size
        self.bos_token, self.eos_token = ct2_token(config.bos_token_id), ct2_token(config.eos_token_id)
        self.unk_token = ct2_token(3)  # BART's <unk>

    def get_vocab(self) -> dict[str, int]:
        return {ct2_token(i): i for i in range(self.size)}

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return ct2_token(token_id)

    def __len__(self) -> int:
        return self.size


def convert_to_ct2(folder: str, out_dir: str) -> str:
    """Convert a BART checkpoint folder to a CTranslate2 float32 model in `out_dir`; returns it.

    transformers 5's ``BartConfig`` has no ``normalize_before`` (BART is post-norm), which the
    converter reads: it is set to False on the loaded model's config.
    """
    from ctranslate2.converters import TransformersConverter

    class _Converter(TransformersConverter):
        config = None

        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            model.config.normalize_before = False
            self.config = model.config
            return model

        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _IdVocabulary(self.config)

    return _Converter(folder).convert(out_dir, force=True)


class CTranslate2Engine:
    """A ``ctranslate2.Translator`` on the converted model: one ``translate_batch`` call."""

    def __init__(self, spec: EngineSpec, folder: str, generation_kwargs: dict, threads: int, ct2_folder: str):
        import ctranslate2

        self.spec = spec
        self.settings = checkpoint_settings(folder, generation_kwargs)
        self.translator = ctranslate2.Translator(
            ct2_folder, device="cpu", compute_type=spec.dtype, inter_threads=1, intra_threads=threads
        )
        self.options = ct2_options(self.settings)
        self.source = self.prefix = None

    def prepare(self, docs: list[list[int]]) -> None:
        self.source = [[ct2_token(t) for t in doc] for doc in docs]
        forced = self.settings.forced_bos_token_id
        self.prefix = None if forced is None else [[ct2_token(forced)] for _ in docs]

    def generate(self) -> list[list[int]]:
        results = self.translator.translate_batch(self.source, target_prefix=self.prefix, **self.options)
        return [ct2_ids(result.hypotheses[0], self.settings) for result in results]


def load_engine(spec: EngineSpec, folder: str, generation_kwargs: dict, threads: int, ct2_folder: str | None = None):
    """The engine `spec` names, loaded from `folder`; ctranslate2 from `ct2_folder` (:func:`convert_to_ct2`)."""
    if spec.name == "ctranslate2":
        if ct2_folder is None:
            raise ValueError("the ctranslate2 engine needs the converted model's folder")
        return CTranslate2Engine(spec, folder, generation_kwargs, threads, ct2_folder)
    return TorchEngine(spec, folder, generation_kwargs)
