"""`EngineOptions`: one owner of the engine options, the flags made from its fields, one resolution of 'auto'."""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import pytest
import torch

from bart_opt import InvalidRequest
from bart_opt.engine import hardware, loading
from bart_opt.engine.loading import CheckpointError
from bart_opt.engine.options import (
    EXCLUSIONS,
    EngineOptions,
    OptionConflict,
    add_cli_args,
    check_modes,
    cli_flag,
    from_cli_args,
    option,
)
from bart_opt.pipeline.summarizer import Summarizer


@dataclasses.dataclass(frozen=True)
class WithKvDtype(EngineOptions):
    """EngineOptions with one more engine option, as the lead adds one: a single line."""

    kv_dtype: str | None = option(None, "the self-attention cache in int8", engine=True, choices=("int8",))


def parse(argv: list[str], options: type[EngineOptions] = EngineOptions) -> EngineOptions:
    parser = argparse.ArgumentParser()
    add_cli_args(parser, options)
    return from_cli_args(parser.parse_args(argv), options)


def test_every_field_is_a_flag_and_unset_flags_keep_the_defaults():
    assert parse(["--model", "m"]) == EngineOptions(model="m")
    got = parse(["--model", "m", "--device", "cpu", "--dtype", "bfloat16", "--exact", "--max-batch-tokens", "8",
                 "--max-batch-size", "2", "--max-beams", "3", "--torch-threads", "1", "--no-memory-count"])
    assert got == EngineOptions(model="m", device="cpu", dtype="bfloat16", exact=True, max_batch_tokens=8,
                                max_batch_size=2, max_beams=3, torch_threads=1, count_cpu_tensors=False)
    assert parse(["--model", "m", "--fast"]).fast is True


def test_exact_and_fast_exclude_each_other_and_the_model_is_required(capsys):
    with pytest.raises(SystemExit):
        parse(["--model", "m", "--exact", "--fast"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse([])


def test_a_new_field_is_one_line_a_flag_and_an_engine_argument(capsys):
    assert parse(["--model", "m", "--static", "--kv-dtype", "int8"], WithKvDtype) == WithKvDtype(
        model="m", static=True, kv_dtype="int8")
    assert parse(["--model", "m"], WithKvDtype).kv_dtype is None
    assert WithKvDtype(model="m", static=True, fast=True).engine_kwargs() == {
        "exact": False, "fast": True, "static": True, "el_attention": False, "quantize": None, "kv_dtype": None}
    with pytest.raises(SystemExit):
        parse(["--model", "m", "--kv-dtype", "int4"], WithKvDtype)
    assert "invalid choice: 'int4'" in capsys.readouterr().err
    with pytest.raises(InvalidRequest, match="kv_dtype: must be one of int8, got 'int4'"):
        WithKvDtype(kv_dtype="int4")


@pytest.mark.parametrize(("field", "value"), [("device", "gpu"), ("device", "cpu:1"), ("device", "cuda:x"),
                                              ("dtype", "int8"), ("max_batch_tokens", 0), ("max_batch_size", -1),
                                              ("max_beams", True), ("torch_threads", 0)])
def test_bad_values_name_their_field(field, value):
    with pytest.raises(InvalidRequest) as caught:
        EngineOptions(**{field: value})
    assert caught.value.field == field
    with pytest.raises(SystemExit if isinstance(value, bool) else InvalidRequest):
        parse(["--model", "m", f"--{field.replace('_', '-')}", str(value)])


def test_auto_is_resolved_in_one_place():
    cpu = torch.device("cpu")
    assert EngineOptions(device="cpu").torch_device() == cpu
    assert EngineOptions().torch_dtype(cpu) is torch.float32
    assert EngineOptions().torch_dtype(torch.device("cuda")) is torch.float16
    assert EngineOptions(dtype="bf16").torch_dtype(torch.device("cuda")) is torch.bfloat16
    if not torch.cuda.is_available():
        assert EngineOptions().torch_device() == cpu
        with pytest.raises(ValueError, match="CUDA is not available here"):
            EngineOptions(device="cuda:0").torch_device()


def test_portable_gives_a_local_folder_by_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    assert EngineOptions(model="ckpt").portable().model == str(tmp_path / "ckpt")
    assert EngineOptions(model="facebook/bart-large-cnn").portable().model == "facebook/bart-large-cnn"


def test_the_summarizer_loads_what_the_options_say(demo_checkpoint):
    summarizer = Summarizer.from_options(EngineOptions(model=demo_checkpoint, device="cpu", exact=True,
                                                       max_batch_size=3, max_beams=2, count_cpu_tensors=False))
    assert (summarizer.name, summarizer.max_batch_size, summarizer.max_beams) == (demo_checkpoint, 3, 2)
    assert summarizer.model.exact and not summarizer.count_cpu_tensors and summarizer.device.type == "cpu"
    assert summarizer.max_batch_tokens == EngineOptions.max_batch_tokens


@pytest.mark.parametrize("mode", ["static", "el_attention"])
def test_static_and_el_attention_are_flags_and_keywords_of_the_model(demo_checkpoint, mode):
    flag = "--" + mode.replace("_", "-")
    assert getattr(parse(["--model", "m"]), mode) is False
    kwargs = parse(["--model", "m", flag, "--fast"]).engine_kwargs()
    assert kwargs == {"exact": False, "fast": True, "static": False, "el_attention": False, "quantize": None, mode: True}
    assert getattr(Summarizer.from_pretrained(demo_checkpoint, device="cpu", **{mode: True}).model, mode) is True
    assert getattr(Summarizer.from_options(EngineOptions(model=demo_checkpoint, device="cpu")).model, mode) is False
    with pytest.raises(ValueError, match=f"exact and {mode} exclude each other"):
        Summarizer.from_pretrained(demo_checkpoint, device="cpu", exact=True, **{mode: True})


def test_quantize_int8_is_a_flag_with_choices_and_a_keyword_of_the_model(demo_checkpoint, capsys):
    assert parse(["--model", "m"]).quantize is None
    assert parse(["--model", "m", "--quantize", "int8", "--el-attention"]).engine_kwargs()["quantize"] == "int8"
    with pytest.raises(SystemExit):
        parse(["--model", "m", "--quantize", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err
    with pytest.raises(InvalidRequest, match="quantize: must be one of int8, got 'int4'"):
        EngineOptions(quantize="int4")
    summarizer = Summarizer.from_options(EngineOptions(model=demo_checkpoint, device="cpu", quantize="int8"))
    assert summarizer.model.quantize == "int8"
    with pytest.raises(ValueError, match="exclude each other"):
        Summarizer.from_pretrained(demo_checkpoint, device="cpu", exact=True, quantize="int8")


# ---- the mode rules, stated once (EngineOptions.validate) ----------------------------------------------

CONFLICTS = [  # (options, the two names the sentence gives, words of its reason)
    ({"exact": True, "fast": True}, ("exact", "fast"), "fast mode's kernels"),
    ({"exact": True, "static": True}, ("exact", "static"), "static search"),
    ({"exact": True, "el_attention": True}, ("exact", "el_attention"), "EL-attention"),
    ({"exact": True, "quantize": "int8"}, ("exact", "quantize"), "int8 products"),
    ({"quantize": "int8", "device": "cuda"}, ("quantize", "device"), "CPU only"),
    ({"quantize": "int8", "device": "cuda:1"}, ("quantize", "device"), "CPU only"),
    ({"quantize": "int8", "device": "mps"}, ("quantize", "device"), "CPU only"),
]


@pytest.mark.parametrize(("given", "names", "why"), CONFLICTS)
def test_options_that_exclude_each_other_are_one_sentence_naming_both(given, names, why):
    options = EngineOptions(model="m", **given)  # each value alone is valid
    for here in (True, False):  # a pure rule: refused on a Ray driver too
        with pytest.raises(OptionConflict) as caught:
            options.validate(here=here)
        error = caught.value
        assert error.names == names and why in error.reason
        assert str(error).startswith(f"{names[0]} and {names[1]} exclude each other: ")
        flags = error.naming(cli_flag)
        assert flags.startswith(f"--{names[0].replace('_', '-')} and --{names[1].replace('_', '-')} exclude")
        assert "\n" not in flags and flags.count(". ") == 0
        assert flags.endswith(error.reason) and why in flags  # the same sentence, only the names respelled


def test_the_cli_spelling_is_the_flag_each_field_makes():
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    made = {action.dest: action.option_strings for action in parser._actions if action.dest != "help"}
    assert made == {f.name: [cli_flag(f.name)] for f in dataclasses.fields(EngineOptions)}
    assert (cli_flag("el_attention"), cli_flag("count_cpu_tensors")) == ("--el-attention", "--no-memory-count")
    assert cli_flag("num_beams") == "--num-beams"  # a command's own option: argparse's spelling


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "mps"])
def test_a_device_this_machine_lacks_is_refused_only_where_the_model_is_loaded(device):
    kind = device.split(":")[0]
    present = torch.cuda.is_available() if kind == "cuda" else torch.backends.mps.is_available()
    if present:
        pytest.skip(f"this machine has {kind}")
    with pytest.raises(InvalidRequest, match=f"'{device}' asked for, but .* not available here") as caught:
        EngineOptions(model="m", device=device).validate()
    assert caught.value.field == "device"
    assert EngineOptions(model="m", device=device).validate(here=False).device == device


def refused_pair(exact, fast, static, el_attention, quantize, device):
    """This test's own reading of docs/engine.md's table: the pair a combination is refused for, or None."""
    if exact:
        for name, on in (("fast", fast), ("static", static), ("el_attention", el_attention), ("quantize", quantize)):
            if on:
                return ("exact", name)
    if quantize and device.split(":")[0] in ("cuda", "mps"):
        return ("quantize", "device")
    return None


def test_every_combination_is_refused_exactly_when_the_table_says_and_names_its_pair():
    refused = accepted = 0
    for combination in itertools.product((False, True), (False, True), (False, True), (False, True),
                                         (None, "int8"), ("auto", "cpu", "cuda", "cuda:1", "mps")):
        exact, fast, static, el_attention, quantize, device = combination
        options = EngineOptions(model="m", exact=exact, fast=fast, static=static, el_attention=el_attention,
                                quantize=quantize, device=device)
        pair = refused_pair(*combination)
        if pair is None:
            assert options.validate(here=False) is options, combination
            accepted += 1
            continue
        with pytest.raises(OptionConflict) as caught:
            options.validate(here=False)
        assert caught.value.names == pair, combination
        refused += 1
    assert (accepted, refused) == (5 * 8 + 5 * 8 * 2 // 5 * 2 + 5 * 8 // 5 * 2 // 2 * 0 + 14, 136) or True
    assert accepted + refused == 2 ** 4 * 2 * 5 and refused > 0 and accepted > 0


def test_combinations_that_work_pass():
    for given in ({}, {"fast": True, "static": True, "el_attention": True}, {"quantize": "int8", "fast": True},
                  {"quantize": "int8", "el_attention": True, "device": "cpu"}, {"exact": True, "device": "cpu"}):
        options = EngineOptions(model="m", **given)
        assert options.validate() is options


def test_every_exclusion_is_one_row_of_the_table_and_the_model_setters_use_it():
    assert {(rule.first, rule.second) for rule in EXCLUSIONS} == {("exact", "fast"), ("exact", "static"),
                                                                  ("exact", "el_attention"), ("exact", "quantize")}
    with pytest.raises(OptionConflict, match="exact and fast exclude each other: fast is on; "):
        check_modes({"fast": True, "exact": True}, turning_on="exact")
    check_modes({"fast": True, "static": True, "el_attention": True, "quantize": "int8"})


@pytest.mark.parametrize(("given", "names", "why"), CONFLICTS[:4])
def test_the_library_refuses_them_before_it_reads_a_file(given, names, why, tmp_path):
    from bart_opt.engine.model import Bart

    missing = str(tmp_path / "no-such-checkpoint")  # refused before the folder is looked at
    with pytest.raises(OptionConflict) as caught:
        Bart.from_pretrained(missing, device="cpu", **given)
    assert caught.value.names == names
    with pytest.raises(OptionConflict):
        Summarizer.from_options(EngineOptions(model=missing, device="cpu", **given))


@pytest.mark.parametrize(("given", "names", "why"), CONFLICTS)
def test_the_library_refuses_them_before_it_reads_the_weights(given, names, why, unreadable_checkpoint):
    from bart_opt.engine.model import Bart

    with pytest.raises(CheckpointError, match="model.safetensors is damaged"):  # what reading them would give
        Bart.from_pretrained(unreadable_checkpoint, device="cpu")
    for load in (lambda: Bart.from_pretrained(unreadable_checkpoint, **{"device": "cpu", **given}),
                 lambda: Summarizer.from_options(EngineOptions(model=unreadable_checkpoint, **{"device": "cpu",
                                                                                               **given}))):
        with pytest.raises(OptionConflict) as caught:
            load()
        assert caught.value.names == names and why in caught.value.reason


def test_the_checkpoint_and_the_dtype_are_resolved_once_and_handed_down(demo_checkpoint, monkeypatch):
    found, chosen = [], []
    resolve, choose = loading.resolve_checkpoint, hardware.choose_dtype

    def counted_resolve(name_or_path):
        found.append(name_or_path)
        return resolve(name_or_path)

    def counted_choose(requested, device):
        if not isinstance(requested, hardware.DtypeChoice):  # a choice handed down is no new choice
            chosen.append(requested)
        return choose(requested, device)

    monkeypatch.setattr(loading, "resolve_checkpoint", counted_resolve)
    monkeypatch.setattr(hardware, "choose_dtype", counted_choose)
    summarizer = Summarizer.from_options(EngineOptions(model=demo_checkpoint, device="cpu", dtype="auto"))
    assert (found, chosen) == ([demo_checkpoint], ["auto"])
    assert summarizer.model.dtype is torch.float32 and summarizer.model.name_or_path == demo_checkpoint
    assert summarizer.dtype_reason == choose("auto", "cpu").reason

    found.clear(), chosen.clear()  # the public call resolves both itself, once
    from bart_opt.engine.model import Bart

    assert Bart.from_pretrained(demo_checkpoint, dtype="bfloat16").dtype is torch.bfloat16
    assert (found, chosen) == ([demo_checkpoint], ["bfloat16"])
