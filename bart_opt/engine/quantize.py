"""bart_opt's int8 mode: `Bart.from_pretrained(..., quantize="int8")`, on a CPU.

At load, each linear layer's float32 weight (N, K) is quantized to int8 per output channel
(symmetric: row n is `q[n] * scale[n]`, |q| <= 127) and packed once for torch's quantized
engine; at each call the activation is quantized dynamically (per tensor, asymmetric uint8,
its range read from the tensor), multiplied in int8 with int32 accumulation, and rescaled to
float32 with the bias added, in one operator (`torch.ops.quantized.linear_dynamic`).

Which layers (bart-base shape; the figures behind each choice are in docs/cpu.md):

* every projection of both stacks (self-attention's fused Q/K/V as one int8 product over one
  packed weight, the output projections, cross-attention's query projection, fc1 and fc2);
* not cross-attention's keys and values: their float weights stay as they are, because
  EL-attention (`bart_opt.engine.el_attention`) multiplies queries and outputs by those float weights
  instead of projecting the encoder states; they run once per generate call (a few percent of it);
* the vocabulary projection too (`Int8Vocabulary`): at the decoder step's 48 rows it is the
  largest product, and int8 takes it from 15.1 to 1.6 ms (oneDNN, AVX-512) and from 48 to 24 ms
  (fbgemm, AVX2); a generate of 4 of the benchmark's documents, one thread: 9.6 -> 8.6 CPU s in
  float32, 6.8 -> 4.9 CPU s under bfloat16 with the fast mode (docs/cpu.md);
* attention itself stays in float (the model's dtype: float32, or bfloat16 with `dtype`).

The kernel: torch's x86 engine (fbgemm), on every x86 CPU. oneDNN's engine runs the decoder
step's products about twice as fast on AVX-512 VNNI and AMX (0.10 against 0.22 ms at (48, 768)
x (768, 3072)), but keeps the int8 weights twice (the resident memory of bart-base's int8 weights
340 MiB, against 233 MiB with fbgemm and 541 MiB in float32; docs/cpu.md). Without VNNI the int8
inner loop sums pairs of u8 x s8 products in 16 bits, which saturate unless activations keep to
7 bits (`reduce_range`): measured on a (48, 768)
x (768, 3072) product limited to AVX2, 7 bits give a relative error of 1.6% against float, 8
bits 1.2% with a largest error 5.6x the 7-bit one (saturation). With VNNI the sum is 32-bit and
8 bits are safe (1.0%). torch marks `torch.ao.quantization` deprecated in favour of torchao;
torchao 0.18 (the release that runs with torch 2.13) has no eager x86 kernel as fast as these
operators (docs/cpu.md), so they are used directly, behind this one module.

The packed weights are not parameters: `Int8Linear.nbytes` counts them and `Bart.weights_bytes`
adds them. A quantized model is quantized at load; it has no int8 state_dict to save.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from bart_opt.engine import hardware, native
from bart_opt.errors import InvalidRequest

MODES = ("int8",)
"""The `quantize` values `Bart.from_pretrained` takes (and None: no quantization)."""


def check_engine(quantize: str) -> None:
    """Refuse int8 where this build of torch lacks the kernel it runs on (which modes and devices it excludes is
    stated in `bart_opt.engine.options.EXCLUSIONS` and `EngineOptions.validate`, which calls this)."""
    if "x86" not in torch.backends.quantized.supported_engines:
        raise InvalidRequest("quantize", f"{quantize!r} needs torch's x86 quantized engine (fbgemm), which this build "
                                         f"of torch lacks (it has {torch.backends.quantized.supported_engines})")


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float -> (N, K) int8 and (N,) float32 scales, symmetric per row: weight[n] ~ q[n] * scale[n]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # (N,)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (N, K)
    return q, scale


@contextlib.contextmanager
def _engine(name: str):
    """torch's quantized engine set to `name` for a prepack (the packed weight keeps its engine)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


class Int8Linear(nn.Module):
    """`x @ weight.T + bias` over (..., K) -> (..., N), weight quantized per output channel at construction,
    x per call (see the module docstring). Input and output keep x's dtype; the product runs on float32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        n, k = weight.shape
        cpu = hardware.probe()
        q, scale = quantize_rows(weight)
        with warnings.catch_warnings():  # "quantized tensor creation functions are deprecated": see module docstring
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros(n, dtype=torch.long), 0)
            with _engine("x86"):
                self._packed = torch.ops.quantized.linear_prepack(
                    qweight, None if bias is None else bias.detach().float().contiguous())
        self.in_features, self.out_features = k, n
        self.reduce_range = not cpu.int8_vnni
        # int8 weight, float32 scale and column offsets (the kernel's), float32 bias
        self.nbytes = n * k + 8 * n + (4 * n if bias is not None else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # (M, K)
        if flat.dtype != torch.float32:
            flat = flat.float()
        out = torch.ops.quantized.linear_dynamic(flat, self._packed, self.reduce_range)  # (M, N) float32
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8Vocabulary(nn.Module):
    """The tied embedding (V, D) quantized per token, in place of `Bart.shared`: the logits through one
    `Int8Linear` (`final_logits_bias` as its bias), the token embeddings looked up in an int8 table
    with one scale per token (the same numbers: the packed weight cannot be read by row)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.logits = Int8Linear(weight, bias)
        q, scale = quantize_rows(weight)
        self.register_buffer("table", q)  # (V, D) int8
        self.register_buffer("scale", scale[:, None])  # (V, 1), converted with the model's dtype

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) decoder states -> (..., V) float32 logits, bias included."""
        return self.logits(hidden.float())

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, T) ids -> (N, T, D) token embeddings in the model's dtype (a fresh tensor)."""
        return F.embedding(ids, self.table).to(self.scale.dtype).mul_(F.embedding(ids, self.scale))


def quantize_model(model) -> list[torch.Tensor]:
    """Quantize `model`'s layers in place (see the module docstring); float32 weights in.

    Returns the float tensors it replaced, for the caller to release (`bart_opt.engine.loading.release_pages`)."""
    replaced: list[torch.Tensor] = []

    def int8(linear: nn.Linear) -> Int8Linear:
        replaced.append(linear.weight)
        return Int8Linear(linear.weight, linear.bias)

    for layer in [*model.encoder.layers, *model.decoder.layers]:
        layer.fc1, layer.fc2 = int8(layer.fc1), int8(layer.fc2)
        attn = layer.self_attn
        attn.out_proj = int8(attn.out_proj)
        attn.fused_int8 = Int8Linear(attn.fused_weight, attn.fused_bias)
        replaced += [attn.fused_weight, *(getattr(attn, name).weight for name in attn.fused)]
        for name in attn.fused:
            delattr(attn, name)
        attn.fused_weight = attn.fused_bias = None
    for layer in model.decoder.layers:  # cross-attention: the query and output products (its K/V stay float)
        cross = layer.encoder_attn
        cross.q_proj, cross.out_proj = int8(cross.q_proj), int8(cross.out_proj)
    model.vocab_int8 = Int8Vocabulary(model.shared.weight, model.final_logits_bias[0])
    replaced.append(model.shared.weight)
    del model.shared
    model.quantize = "int8"
    c = model.config
    model.state_dtype = attention_state_dtype(model.dtype, c.d_model // c.decoder_attention_heads)  # builds the kernel
    return replaced


def attention_state_dtype(dtype: torch.dtype, head_dim: int) -> torch.dtype | None:
    """The dtype the int8 mode keeps its attention state in (cross-attention keys and values, the decoder's
    self-attention cache) for a model computing in `dtype` with heads `head_dim` wide: bfloat16 for float32
    where bart_opt's kernel runs here (`bart_opt.engine.native`, AVX512-BF16 or AVX2; built now, at load, if it was
    not yet), else None: the model's own dtype.

    The int8 products already round their activations to 7 or 8 bits; bfloat16 keeps 8, so the state adds
    rounding no larger than the products'. It halves the bytes every decoder step reads, and the kernel attends
    over the cache through a row table, so beam steps copy no keys/values (measured in docs/cpu.md, "The
    bfloat16 attention state"). Without the kernel the state stays in `dtype`: torch's bfloat16 attention is
    slower than its float32 on a CPU without native bfloat16 (self-attention of 48 beams on an AVX2 EPYC, one
    thread: 8.75 against 4.78 ms)."""
    if dtype != torch.float32 or not native.handles(torch.empty(0, dtype=torch.bfloat16), head_dim):
        return None
    return torch.bfloat16


def packed_bytes(model: nn.Module) -> int:
    """Bytes of the int8 weights packed outside torch's tensors (`Int8Linear.nbytes`) in `model`."""
    return sum(m.nbytes for m in model.modules() if isinstance(m, Int8Linear))
