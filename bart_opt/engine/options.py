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

Which options exclude each other is stated once, here too (`EXCLUSIONS`, `check_modes`):
`EngineOptions.validate` refuses a combination with one `OptionConflict` naming both options,
before anything is loaded. The command line calls it after parsing (``--exact --static``: exit 2),
the service's settings when they are read (``BART_OPT_EXACT=true BART_OPT_FAST=true bart-opt
serve``: exit 2), `bart_opt.Summarizer.from_options` and `bart_opt.Bart.from_pretrained` before
they read a file, a Ray pool on its driver and each replica before its load. `Bart`'s mode
setters (``model.exact = True``) apply the same table. Each surface names the two options in its
own spelling through `OptionConflict.naming`: `cli_flag` (the flag `add_cli_args` made) on the
command line, ``BART_OPT_<FIELD>`` in the service. The table in prose: docs/engine.md, "Which modes
go together".
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bart_opt.errors import InvalidRequest

if TYPE_CHECKING:
    import torch

    from bart_opt.engine.hardware import DtypeChoice

DEVICE_KINDS = ("auto", "cpu", "cuda", "mps")
_COUNTS = ("max_batch_tokens", "max_batch_size", "max_beams", "torch_threads")  # integers >= 1 (or None)
_EXACT = ("exact mode gives every kernel transformers' inputs so that its ids equal transformers' bit for bit, "
          "and {what}; turn one of them off")


@dataclass(frozen=True)
class Exclusion:
    """Two engine options that cannot both be on (a `quantize` value counts as on), and why."""

    first: str
    second: str
    reason: str


EXCLUSIONS = (
    Exclusion("exact", "fast", _EXACT.format(what="the fast mode's kernels leave padded keys out and round otherwise")),
    Exclusion("exact", "static", _EXACT.format(what="the static search runs fixed shapes with another attention "
                                                    "layout")),
    Exclusion("exact", "el_attention", _EXACT.format(what="EL-attention computes cross-attention in another order "
                                                          "(projections on the query side), which rounds differently")),
    Exclusion("exact", "quantize", _EXACT.format(what="int8 products round differently from transformers' float ones")),
)
"""Every pair of engine modes that exclude each other (the device rules are in `EngineOptions.validate`)."""
MODE_FIELDS = ("exact", "fast", "static", "el_attention", "quantize")
_CPU_ONLY = ("int8 runs on a CPU only (torch's int8 dynamic-quantized linear is a CPU kernel); on {device} use dtype "
             "float16 or bfloat16 instead, or device cpu")


class OptionConflict(InvalidRequest):
    """Two options that exclude each other: `names` (field names, the first is `field`) and `reason`.

    ``str(error)`` and `message` name them as fields (``exact and fast exclude each other: ...``);
    `naming` spells them as a surface does (``--exact``, ``BART_OPT_EXACT``).
    """

    def __init__(self, names: tuple[str, str], reason: str, on: str | None = None) -> None:
        self.names = names
        self.reason = reason if on is None else f"{on} is on; {reason}"
        super().__init__(names[0], f"{names[0]} and {names[1]} exclude each other: {self.reason}")

    def __str__(self) -> str:
        return self.message

    def naming(self, spell: Callable[[str], str]) -> str:
        """The sentence with both options spelled by `spell`, the surface's one spelling of a field:
        `cli_flag` on the command line (``--exact and --quantize``), `app.settings.setting_name` in
        the service (``BART_OPT_EXACT and BART_OPT_QUANTIZE``)."""
        return f"{spell(self.names[0])} and {spell(self.names[1])} exclude each other: {self.reason}"


def check_modes(modes: Mapping[str, Any], turning_on: str | None = None) -> None:
    """Raise `OptionConflict` for the first of `EXCLUSIONS` whose two options are both on in `modes` (field ->
    value; a truthy value is on). `turning_on` names the option being switched on (a model's setter): the
    sentence then names it first and says which other one is on."""
    for rule in EXCLUSIONS:
        if modes.get(rule.first) and modes.get(rule.second):
            if turning_on in (rule.first, rule.second):
                other = rule.second if turning_on == rule.first else rule.first
                raise OptionConflict((turning_on, other), rule.reason, on=other)
            raise OptionConflict((rule.first, rule.second), rule.reason)


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
            from bart_opt.engine.config import resolve_dtype

            try:
                resolve_dtype(value)
            except ValueError as error:
                raise InvalidRequest("dtype", f"{error} (or auto)") from None
        elif name in _COUNTS and value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(name, f"must be an integer >= 1, got {value!r}")
        return value

    def modes(self) -> dict[str, Any]:
        """The mode options (`MODE_FIELDS`) and their values."""
        return {name: getattr(self, name) for name in MODE_FIELDS}

    def validate(self, *, here: bool = True) -> EngineOptions:
        """These options if they can run together; `OptionConflict` naming both options otherwise.

        Always: `EXCLUSIONS`, and `quantize` with a ``cuda`` or ``mps`` device. With `here` (where
        the model is to be loaded; a Ray driver passes False for its replicas), also what this
        machine lacks: the device asked for (``InvalidRequest`` on ``device``), ``auto`` resolving to
        a GPU for int8, torch's x86 quantized engine for int8. Nothing is loaded or read.
        """
        check_modes(self.modes())
        kind = self.device.partition(":")[0]
        if self.quantize is not None and kind in ("cuda", "mps"):
            raise OptionConflict(("quantize", "device"), _CPU_ONLY.format(device=kind))
        if here:
            device = self.torch_device()
            if self.quantize is not None:
                if device.type != "cpu":
                    raise OptionConflict(("quantize", "device"),
                                         f"device auto is {device.type} here, and " + _CPU_ONLY.format(device=device.type))
                from bart_opt.engine.quantize import check_engine

                check_engine(self.quantize)
        return self

    # ---- resolved once ---------------------------------------------------------------------

    def torch_device(self) -> torch.device:
        """The device to load on: ``auto`` is cuda when available, else cpu. Raises `InvalidRequest`
        (on ``device``) for cuda, a cuda index or mps asked for where there is none."""
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidRequest("device", f"{self.device!r} asked for, but CUDA is not available here; use 'cpu'")
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            raise InvalidRequest("device", f"{self.device!r} asked for, but this machine has "
                                           f"{torch.cuda.device_count()} CUDA device(s)")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise InvalidRequest("device", f"{self.device!r} asked for, but MPS (Apple's GPU) is not available here; "
                                           "use 'cpu'")
        return device

    def dtype_choice(self, device: torch.device) -> DtypeChoice:
        """The dtype on `device` and why: ``auto`` is float16 on CUDA and float32 elsewhere
        (`bart_opt.engine.hardware.choose_dtype`, which logs the choice and warns of an emulated bfloat16)."""
        from bart_opt.engine import hardware

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

def cli_flag(name: str, options: type[EngineOptions] = EngineOptions) -> str:
    """The command-line flag of field `name` of `options`, as `add_cli_args` adds it (``el_attention`` ->
    ``--el-attention``, ``count_cpu_tensors`` -> ``--no-memory-count``); a name that is no field of
    `options` (another option of a command) -> ``--<name>`` with dashes, argparse's spelling."""
    flag = next((f.metadata["flag"] for f in fields(options) if f.name == name), None)
    return flag or "--" + name.replace("_", "-")


def add_cli_args(parser: argparse.ArgumentParser, options: type[EngineOptions] = EngineOptions) -> None:
    """One flag per field of `options` (unset flags read None, so the field's default applies)."""
    hints = typing.get_type_hints(options)
    groups: dict[str, Any] = {}
    for f in fields(options):
        meta = f.metadata
        flag = cli_flag(f.name, options)
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


__all__ = ["EXCLUSIONS", "EngineOptions", "Exclusion", "OptionConflict", "add_cli_args", "check_modes", "cli_flag",
           "from_cli_args", "option"]
