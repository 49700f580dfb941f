"""The int8-state A/B's profile table: operators ranked by self time, with shares of the whole call."""

import torch
from torch.profiler import ProfilerActivity, profile

from bart_opt.bench.int8_state import _recorded, top_ops_table


def test_the_profile_table_ranks_operators_by_self_time_and_their_shares_add_up():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            a @ b
        a.add(b)
    events = prof.key_averages()
    table = top_ops_table(events, top=100).splitlines()
    rows = [line.split("|")[1:-1] for line in table[2:]]
    seconds = [float(row[2]) for row in rows]
    assert seconds == sorted(seconds, reverse=True)
    assert {"`aten::mm`", "`aten::add`"} <= {row[0].strip() for row in rows}
    mm = next(row for row in rows if row[0].strip() == "`aten::mm`")
    assert int(mm[1]) == 20
    assert abs(sum(float(row[3].strip().rstrip("%")) for row in rows) - 100.0) < 0.1 * len(rows)
    assert len(top_ops_table(events, top=1).splitlines()) == 3


def test_the_kernel_call_is_recorded_as_one_operator_of_its_own():
    a = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _recorded(torch.mm, "bart_opt::decode_attention")(a, a)
        _recorded(torch.mm, "bart_opt::decode_attention")(a, a)
    rows = {e.key: e.count for e in prof.key_averages()}
    assert rows["bart_opt::decode_attention"] == 2 and rows["aten::mm"] == 2
