"""bart_opt's bfloat16 decoding-attention kernel: float32-accurate, strided views, thread-count
independent, and a clean fallback where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from bart_opt.engine import native



@pytest.fixture(params=["avx512_bf16", "avx2"])
def isa(request):
    """Each build of the kernel this CPU can execute (an AVX512-BF16 CPU runs both), picked as `native.kernel`'s;
    the tests that need a build skip where this one cannot run here."""
    runnable = native.runnable_isas()  # the CPU's own answer, before the patch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "kernel_isa", lambda: request.param)
        patch.setattr(native, "runnable_isas", lambda: runnable)
        yield request.param


@pytest.fixture
def built(isa):
    """Skips where this build cannot run: a CPU without its instructions, or no C++ compiler (warned by
    native)."""
    if isa not in native.runnable_isas():
        pytest.skip(f"this CPU cannot run the kernel's {isa} build")
    if native.kernel() is None:
        pytest.skip(f"bart_opt's attention kernel ({isa}) could not be built here (see the warning)")


needs_kernel = pytest.mark.usefixtures("built")


def _inputs(g: int, h: int, m: int, n: int, d: int, capacity: int | None = None, spread: float = 1.0, seed: int = 0):
    """bfloat16 q (G, H, M, d) and k, v (G, H, N, d); with `capacity`, k and v are the first N positions of
    (G, H, capacity, d) buffers, as the decoder's self-attention cache hands them over."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(g, h, m, d, generator=gen) * spread).bfloat16()
    k, v = ((torch.randn(g, h, capacity or n, d, generator=gen) * spread).bfloat16()[:, :, :n] for _ in range(2))
    return q, k, v


def _float32_reference(q, k, v, scale):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)  # (G, H, M, d)


def _check_rounded_once(got, q, k, v, scale) -> None:
    """`got` is float32 attention rounded once to bfloat16: within half a bfloat16 step of the float32
    result plus float32's own error, which is relative to sum(p |v|) (a result near 0 by cancellation of
    large values carries it too); and the correctly rounded value itself almost everywhere."""
    reference = _float32_reference(q, k, v, scale)
    magnitude = F.scaled_dot_product_attention(q.float(), k.float(), v.float().abs(), scale=scale)  # sum(p |v|)
    step = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(reference.abs().clamp_min(1e-30))))
    error = (got.float() - reference).abs()
    assert bool((error <= 0.5 * step + 1e-5 * magnitude).all()), float((error - 0.5 * step).max())
    assert float((got == reference.bfloat16()).float().mean()) >= 0.99


@needs_kernel
@pytest.mark.parametrize(("g", "h", "m", "n", "d", "capacity"), [
    (1, 12, 4, 1024, 64, None),  # one input's 4 beams against its encoder states (cross-attention)
    (48, 12, 1, 70, 64, 142),  # 48 beams against 70 cached positions of a 142-position cache
    (3, 8, 5, 17, 32, None),  # a query block of 4 and a remainder of 1; keys not a multiple of 16
    (2, 4, 1, 1, 128, 9),  # a single key
    (2, 6, 2, 33, 96, None),
])
def test_equals_float32_attention_rounded_once(g, h, m, n, d, capacity):
    q, k, v = _inputs(g, h, m, n, d, capacity)
    scale = d**-0.5
    got = native.decode_attention(q, k, v, scale)
    assert got.shape == (g, h, m, d) and got.dtype == torch.bfloat16
    _check_rounded_once(got, q, k, v, scale)
    # No worse than torch's own bfloat16 kernel on the same inputs.
    reference = _float32_reference(q, k, v, scale)
    flash = F.scaled_dot_product_attention(q, k, v, scale=scale)
    assert float((got.float() - reference).abs().max()) <= float((flash.float() - reference).abs().max())


@needs_kernel
def test_large_scores_stay_finite_and_accurate():
    q, k, v = _inputs(2, 4, 4, 300, 64, spread=12.0)  # scores up to the hundreds: exp needs the max subtracted
    got = native.decode_attention(q, k, v, 1.0)
    assert bool(torch.isfinite(got).all())
    _check_rounded_once(got, q, k, v, 1.0)


@needs_kernel
def test_writes_into_a_strided_output_and_nowhere_else():
    q, k, v = _inputs(1, 12, 4, 200, 64)
    buffer = torch.full((3, 4, 12, 64), float("nan"), dtype=torch.bfloat16)  # (B, beams, H, d), as cross-attention
    target = buffer[1:2].transpose(1, 2)  # (1, H, beams, d) view of input 1's rows
    returned = native.decode_attention(q, k, v, 0.125, out=target)
    assert returned is target
    assert torch.equal(buffer[1].transpose(0, 1), native.decode_attention(q, k, v, 0.125)[0])
    assert bool(buffer[0].isnan().all()) and bool(buffer[2].isnan().all())


@needs_kernel
def test_same_bits_at_any_thread_count():
    q, k, v = _inputs(16, 12, 1, 140, 64, capacity=142)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.decode_attention(q, k, v, 0.125)
        assert native.kernel().parallel_threads() == 1
        torch.set_num_threads(2)
        two = native.decode_attention(q, k, v, 0.125)
        # Built without OpenMP, the kernel's parallel loop ran on one thread whatever the setting said.
        assert native.kernel().parallel_threads() == 2, "the kernel runs its tasks on torch's threads"
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@needs_kernel
def test_refuses_what_it_was_not_built_for():
    q, k, v = _inputs(1, 2, 1, 8, 64)
    with pytest.raises(RuntimeError, match="bfloat16"):
        native.decode_attention(q.float(), k.float(), v.float(), 0.125)
    with pytest.raises(RuntimeError, match="32, 64, 96 or 128"):
        native.decode_attention(q[..., :48], k[..., :48], v[..., :48], 0.125)
    with pytest.raises(RuntimeError, match="match"):
        native.decode_attention(q, k[:, :1], v, 0.125)
    with pytest.raises(RuntimeError, match="contiguous last dimension"):
        native.decode_attention(q, k.transpose(2, 3), v, 0.125)
    with pytest.raises(RuntimeError, match="overlap"):
        native.decode_attention(q, k, v, 0.125, out=q.new_empty(1, 1, 1, 64).expand(1, 2, 1, 64))


@needs_kernel
def test_a_row_table_reads_each_position_from_the_row_it_names():
    """rows[g, j] = r: position j of row g is row r's (an indirect cache after beam steps); the result equals
    the kernel's on the gathered keys and values, bit for bit."""
    g, n = 6, 23
    q, k, v = _inputs(g, 4, 1, n, 64, capacity=30)
    rows = torch.randint(0, g, (g, 30), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    positions = torch.arange(n)
    gather = lambda t: t[rows[:, :n].long(), :, positions[None, :]].permute(0, 2, 1, 3)  # noqa: E731  (G, H, N, d)
    expected = native.decode_attention(q, gather(k), gather(v), 0.125)
    assert torch.equal(native.decode_attention(q, k, v, 0.125, rows=rows[:, :n]), expected)
    bad = rows[:, :n].clone()
    bad[2, 5] = g
    with pytest.raises(RuntimeError, match="must name groups"):
        native.decode_attention(q, k, v, 0.125, rows=bad)
    with pytest.raises(RuntimeError, match="int32 table"):
        native.decode_attention(q, k, v, 0.125, rows=rows[:, :n].long())


@needs_kernel
def test_handles_bfloat16_cpu_heads_of_the_built_widths_only():
    x = torch.zeros(1, dtype=torch.bfloat16)
    assert native.handles(x, 64) and native.handles(x, 32)
    assert not native.handles(x, 80)
    assert not native.handles(x.float(), 64) and not native.handles(x.half(), 64)


@pytest.fixture
def fresh_kernel():
    """`native.build` forgets its answers before and after the test (the real builds stay cached on disk)."""
    native.build.cache_clear()
    yield
    native.build.cache_clear()


def test_without_avx512_bf16_or_avx2_there_is_no_kernel_and_a_warning(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setattr(native, "kernel_isa", lambda: None)
    with caplog.at_level(logging.WARNING, logger="bart_opt.engine.native"):
        assert native.kernel() is None
        assert not native.handles(torch.zeros(1, dtype=torch.bfloat16), 64)
    assert "lacks AVX512-BF16 and AVX2" in caplog.text
    q, k, v = _inputs(1, 2, 1, 8, 64)
    with pytest.raises(RuntimeError, match="not available here"):
        native.decode_attention(q, k, v, 0.125)


def test_a_failed_build_falls_back_with_the_reason(fresh_kernel, monkeypatch, caplog):
    import torch.utils.cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions\nmore lines")

    monkeypatch.setattr(native, "kernel_isa", lambda: "avx2")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    with caplog.at_level(logging.WARNING, logger="bart_opt.engine.native"):
        assert native.kernel() is None
    assert "building bart_opt's attention kernel failed (Ninja is required to load C++ extensions)" in caplog.text


def test_without_ninja_there_is_no_kernel_and_the_warning_names_the_extra(fresh_kernel, monkeypatch, caplog):
    import torch.utils.cpp_extension

    def never(*args, **kwargs):
        raise AssertionError("the build was started without ninja")

    monkeypatch.setattr(native, "kernel_isa", lambda: "avx2")
    monkeypatch.setattr(torch.utils.cpp_extension, "is_ninja_available", lambda: False)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", never)
    with caplog.at_level(logging.WARNING, logger="bart_opt.engine.native"):
        assert native.kernel() is None
        assert not native.handles(torch.zeros(1, dtype=torch.bfloat16), 64)
    assert "needs ninja to build (pip install 'bart-opt[fast]')" in caplog.text


def test_the_build_follows_the_cpu(monkeypatch):
    from bart_opt.engine import hardware

    cpu = hardware.probe()
    expected = "avx512_bf16" if native.cpu_has_avx512_bf16() else "avx2" if "avx2" in cpu.flags else None
    assert native.kernel_isa() == expected
    assert native.runnable_isas() == {"avx512_bf16": ("avx512_bf16", "avx2"), "avx2": ("avx2",), None: ()}[expected]
    assert set(native.BUILDS) == {"avx512_bf16", "avx2"} and native.BUILDS["avx2"][1] == ["-mavx2", "-mfma"]
