"""`bart_opt.bench.isa`: each library's own report of its ISA, read on Intel and AMD alike."""

from __future__ import annotations

from bart_opt.bench.isa import UNKNOWN, parse, unmet

BANNER = "MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture {}, Lnx 2.45GHz lp64"
# MKL's banner as printed on a Xeon limited to AVX2, a Xeon unlimited, and an AMD EPYC (family 25), where it names
# no instruction set at all.
XEON_AVX2 = BANNER.format("Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors")
XEON = BANNER.format("Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support of Intel(R) Deep "
                     "Learning Boost (Intel(R) DL Boost), Intel(R) Advanced Matrix Extensions (Intel(R) AMX)")
EPYC = BANNER.format("Intel(R) Architecture processors")


def test_mkl_names_its_isa_on_intel_and_none_on_amd():
    assert parse(XEON_AVX2)["mkl"] == "AVX2"
    assert parse(XEON)["mkl"] == "AVX-512+AMX"
    assert parse(EPYC)["mkl"] == UNKNOWN


def test_a_library_that_names_no_isa_does_not_fail_the_avx2_limit_and_one_that_names_another_does():
    onednn = "onednn_verbose,info,cpu,isa:Intel AVX2"
    assert unmet(parse(EPYC + "\n" + onednn), "avx2") == []
    assert unmet(parse(XEON + "\n" + onednn), "avx2") == ["mkl: AVX-512+AMX"]
    assert unmet(parse(XEON), "native") == []
