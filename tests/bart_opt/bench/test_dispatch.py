"""The dispatch-count bench (`python -m bart_opt.bench.dispatch`) at a tiny size: its table's rows hold."""

from __future__ import annotations

import json

import torch

from bart_opt.bench import dispatch
from bart_opt.engine.static_generation import CHECK_EVERY


def test_tiny_dispatch_bench_counts_ops_and_syncs_per_mode(tmp_path, capsys):
    out = tmp_path / "dispatch.json"
    assert dispatch.main(["--shape", "tiny", "--inputs", "3", "--max-len", "16", "--min-length", "10",
                          "--max-length", "24", "--json", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == list(dispatch.MODES)
    static, gpu, cpu = (rows[m] for m in dispatch.MODES)
    assert gpu["steps"] == cpu["steps"] >= 10
    assert gpu["steps"] <= static["steps"] < gpu["steps"] + CHECK_EVERY, "steps past the end: until the next check"
    assert static["ids"] == gpu["ids"], "the static search gives the default's ids here"
    # The default reads the device once a step (its count of moved rows and inputs left); on a CPU its
    # n-gram ban's `nonzero` too (free there). Nothing hidden in either loop.
    assert {k.split(": ")[1] for k in gpu["sync_ops"] if not k.startswith("prepare")} == {"tolist", "item"}
    assert gpu["loop_syncs"] == gpu["steps"] + 1 and cpu["loop_syncs"] >= 2 * gpu["steps"] - 1
    assert gpu["loop_hidden_syncs"] == cpu["loop_hidden_syncs"] == static["loop_hidden_syncs"] == 0
    assert static["loop_syncs"] <= static["steps"] // CHECK_EVERY + 2
    for r in rows.values():
        assert r["decode_ops_per_step"] > 0 and r["search_ops_per_step"] > 0
        assert r["ops_per_step"] == r["decode_ops_per_step"] + r["search_ops_per_step"]
        assert r["syncs"] == sum(r["sync_ops"].values()) >= r["loop_syncs"]
    assert "nonzero" not in str([k for k in static["sync_ops"] if not k.startswith("prepare")])
    printed = capsys.readouterr().out
    for mode in dispatch.MODES:
        assert f"| {mode} | {rows[mode]['steps']} |" in printed


def test_the_counter_sees_syncs_and_skips_views():
    with torch.inference_mode(), dispatch.DispatchCounter() as counter:
        x = torch.arange(6).view(2, 3).t()
        int(x.sum())
        bool((x > 2).any())
        x.nonzero()
    ops = counter.ops["prepare"]
    assert "view" not in ops and "t" not in ops and ops["arange"] == 1
    assert counter.syncs == {"prepare: item": 1, "prepare: is_nonzero": 1, "prepare: nonzero": 1}


def test_the_counter_sees_the_hidden_syncs():
    """What a CPU run hides: each is a `nonzero` or a blocking host-to-device copy on a GPU."""
    with torch.inference_mode(), dispatch.DispatchCounter() as counter:
        x = torch.arange(6.0)
        x[x > 2]  # a mask index
        x[x > 4] = 0.0  # a masked write
        x[[0, 2]]  # a Python list as an index
        torch.tensor([1, 2])  # Python values
        x[1] = 3.0  # a Python scalar: a fill, not a copy
        x.tolist()
    assert counter.syncs == {"prepare: mask_index": 2, "prepare: list_index": 1, "prepare: python_values": 1,
                             "prepare: tolist": 1}
    assert counter.hidden() == 4
    meta = torch.zeros(4, 3, device="meta")
    with dispatch.DispatchCounter() as counter:
        meta.index_select(0, torch.zeros(2, dtype=torch.long))  # a CPU index for a device tensor
        meta + torch.tensor(1.0)  # a 0-d CPU tensor is a scalar argument, no copy
    assert counter.syncs == {"prepare: host_tensor": 1, "prepare: python_values": 1}


def test_the_byte_counter_counts_what_each_op_moves():
    x = torch.zeros(8, 4)  # 128 bytes
    idx = torch.tensor([1, 3])  # 16 bytes
    with torch.inference_mode(), dispatch.DispatchCounter(count_bytes=True) as counter:
        counter.phase = "a"
        x + 1  # reads x, writes a new one
        counter.phase = "b"
        x.index_select(0, idx)  # reads the 2 rows it returns (32 B) and the index, writes 32 B
        counter.phase = "c"
        x.index_copy_(0, idx, torch.ones(2, 4))  # reads index and source, writes 2 rows of x (not all of it)
        counter.phase = "d"
        torch.zeros(1, 4).expand(8, 4) * 2  # a broadcast operand is read once
        counter.phase = "e"
        torch.nn.functional.scaled_dot_product_attention(torch.zeros(1, 1, 2, 4), x[None, None], x[None, None])
    assert counter.bytes["a"] == 256
    assert counter.bytes["b"] == 32 + 16 + 32
    assert counter.bytes["c"] == 32 + (16 + 32 + 32)  # `ones` writes its 32 B; index_copy_ touches 2 rows only
    assert counter.bytes["d"] == 16 + (16 + 128)  # `zeros` writes 16 B; the product reads them once
    assert counter.bytes["e"] == 32 + (32 + 128 + 128 + 32)
    assert counter.ops["e"] == {"zeros": 1, "scaled_dot_product_attention": 1}
