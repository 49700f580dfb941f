"""Engine options, one owner: `EngineOptions`, and the command-line flags made from it.

What a process loads (checkpoint, device, dtype, kernels) and the budgets its pipeline runs
under are the fields of one frozen dataclass. Every surface derives from its fields instead of
restating them, as vLLM's ``EngineArgs`` does:

- the command line: `add_cli_args` adds one flag per field (``--max-batch-tokens``), and
  `from_cli_args` builds the value from the flags given (the others keep their defaults);
- the service: `app.settings.Settings` has one ``BART_OPT_<FIELD>`` setting per field, with the
  field's ``service`` default where the service's differs (`app.settings.engine_settings`);
- a Ray replica: it is handed the value itself (`portable` makes its checkpoint path absolute);
- loading: `bart_opt.Summarizer.from_options` loads what the value describes.

Each field's metadata (`option`) holds its help, its flag when that is not ``--<name>``, whether
it goes to `bart_opt.Bart.from_pretrained` (``engine``) and its exclusive group. Adding an engine
option is one line here, with ``engine=True``: it becomes a flag, a setting, a replica option and
a keyword argument of ``Bart.from_pretrained``.

Values are checked once, here (`InvalidRequest` naming the field); ``"auto"`` device and dtype
are resolved once, here (`torch_device`, `torch_dtype`).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bart_opt.errors import InvalidRequest

if TYPE_CHECKING:
    import torch

    from bart_opt.hardware import DtypeChoice

DEVICE_KINDS = ("auto", "cpu", "cuda", "mps")
_COUNTS = ("max_batch_tokens", "max_batch_size", "max_beams", "torch_threads")  # integers >= 1 (or None)


def option(default: Any, help: str, *, flag: str | None = None, engine: bool = False, service: Any = dataclasses.MISSING,
           exclusive: str | None = None, required: bool = False, choices: tuple | None = None) -> Any:
    """A field of `EngineOptions` with the metadata the surfaces read.

    `flag`: the command-line flag (default ``--<name>``); `engine`: passed to
    ``Bart.from_pretrained``; `service`: the service's default when it differs from `default`;
    `exclusive`: flags of one group exclude each other; `required`: the flag must be given;
    `choices`: the values it takes (None, for an optional field, as well).
    """
    metadata = {"help": help, "flag": flag, "engine": engine, "exclusive": exclusive, "required": required,
                "choices": choices}
    if service is not dataclasses.MISSING:
        metadata["service"] = service
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class EngineOptions:
    """What to load and the budgets to run it under (see the module docstring)."""

    model: str = option("facebook/bart-large-cnn", "checkpoint folder or hub id", required=True)
    device: str = option("auto", "'auto' (cuda when available), 'cpu', 'mps', 'cuda' or 'cuda:N'")
    dtype: str = option("auto", "'auto' (float16 on CUDA, float32 on CPU), float32, float16 or bfloat16")
    exact: bool = option(False, "generate exactly transformers' ids for the same batches, device and dtype (more "
                                "memory and time in beam search; default: shared cross-attention state)",
                         engine=True, exclusive="mode")
    fast: bool = option(False, "faster half-precision kernels (bfloat16 on CPU: bart_opt's own attention kernel, "
                               "built on first use), with summaries that differ from transformers' more often",
                        engine=True, exclusive="mode")
    static: bool = option(False, "static search: fixed shapes, no host syncs between its done-checks, a CUDA graph "
                                 "per decoder step on CUDA; the default's ids up to near-ties (not with --exact)",
                          engine=True)
    el_attention: bool = option(False, "EL-attention: cross-attention keeps one copy of the encoder output for every "
                                       "layer and beam (the least memory; slower on a CPU); the default's ids up to "
                                       "near-ties (not with --exact)", engine=True)
    quantize: str | None = option(None, "'int8': weights quantized per output channel at load, activations "
                                        "dynamically (CPU only; not with --exact; docs/cpu.md)",
                                  engine=True, choices=("int8",))
    max_batch_tokens: int = option(32768, "token budget of one model call: longest input x texts x beams",
                                   service=16384)  # the seed's 8 inputs x 1024 tokens x 4 beams
    max_batch_size: int = option(64, "most texts in one model call", service=32)
    max_beams: int | None = option(None, "largest num_beams a request may ask for (default: no cap)", service=16)
    torch_threads: int | None = option(None, "torch.set_num_threads for the model on CPU (default: torch's own)")
    count_cpu_tensors: bool = option(True, "on CPU, count live tensor bytes for the memory peaks (their overhead "
                                           "is about 10-20% on tiny models; off: peaks read 0)",
                                     flag="--no-memory-count")

    def __post_init__(self) -> None:
        for f in fields(self):
            self.check(f.name, getattr(self, f.name))

    @classmethod
    def check(cls, name: str, value: Any) -> Any:
        """`value` for field `name` if it is valid; `InvalidRequest` naming the field otherwise
        (the one check of every surface: flags, settings, library calls)."""
        choices = {f.name: f.metadata["choices"] for f in fields(cls)}.get(name)
        if choices is not None and value is not None and value not in choices:
            raise InvalidRequest(name, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        if name == "device":
            kind, _, index = value.partition(":")
            if kind not in DEVICE_KINDS or (index and (kind != "cuda" or not index.isdigit())):
                raise InvalidRequest("device", f"must be 'auto', 'cpu', 'mps', 'cuda' or 'cuda:N', got {value!r}")
        elif name == "dtype" and value != "auto":
            from bart_opt.config import resolve_dtype

            try:
                resolve_dtype(value)
            except ValueError as error:
                raise InvalidRequest("dtype", f"{error} (or auto)") from None
        elif name in _COUNTS and value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(name, f"must be an integer >= 1, got {value!r}")
        return value

    # ---- resolved once ---------------------------------------------------------------------

    def torch_device(self) -> torch.device:
        """The device to load on: ``auto`` is cuda when available, else cpu. Raises ValueError for
        cuda asked for where there is none."""
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but CUDA is not available here; use 'cpu'")
        return device

    def dtype_choice(self, device: torch.device) -> DtypeChoice:
        """The dtype on `device` and why: ``auto`` is float16 on CUDA and float32 elsewhere
        (`bart_opt.hardware.choose_dtype`, which logs the choice and warns of an emulated bfloat16)."""
        from bart_opt import hardware

        return hardware.choose_dtype(self.dtype, device)

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype of `dtype_choice`."""
        return self.dtype_choice(device).dtype

    def engine_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``Bart.from_pretrained`` (the fields marked ``engine``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["engine"]}

    def portable(self) -> EngineOptions:
        """The same options for a process started elsewhere (a Ray replica): a local checkpoint
        folder by its absolute path, a hub id as it is."""
        folder = Path(self.model).expanduser()
        return dataclasses.replace(self, model=str(folder.resolve())) if folder.is_dir() else self

def add_cli_args(parser: argparse.ArgumentParser, options: type[EngineOptions] = EngineOptions) -> None:
    """One flag per field of `options` (unset flags read None, so the field's default applies)."""
    hints = typing.get_type_hints(options)
    groups: dict[str, Any] = {}
    for f in fields(options):
        meta = f.metadata
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        target = parser
        if meta["exclusive"] is not None:
            if meta["exclusive"] not in groups:
                groups[meta["exclusive"]] = parser.add_mutually_exclusive_group()
            target = groups[meta["exclusive"]]
        help_text = meta["help"].replace("%", "%%")
        if hints[f.name] is bool:
            target.add_argument(flag, dest=f.name, action="store_const", const=not f.default, default=None,
                                help=help_text)
        else:
            kind = int if int in typing.get_args(hints[f.name]) or hints[f.name] is int else str
            target.add_argument(flag, dest=f.name, type=kind, default=None, required=meta["required"],
                                choices=meta["choices"], help=help_text)


def from_cli_args(args: argparse.Namespace, options: type[EngineOptions] = EngineOptions) -> EngineOptions:
    """`options` from the flags `add_cli_args` added: those given, the defaults for the rest."""
    given = {f.name: getattr(args, f.name) for f in fields(options) if getattr(args, f.name, None) is not None}
    return options(**given)


__all__ = ["EngineOptions", "add_cli_args", "from_cli_args", "option"]
