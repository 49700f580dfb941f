"""Schemathesis hooks for the API contract run (``SCHEMATHESIS_HOOKS=tests.app.schemathesis_hooks``).

A random body that matches the ``POST /evaluate`` schema almost never makes a runnable job: the
inline records need the columns the request names. Half of the positive cases are therefore turned
into small realistic jobs (a few inline records, cheap generation settings), so that the stateful
phase has real job ids to chain into ``GET /evaluate/{job_id}``, its predictions, ``DELETE`` and
the job list. Negative cases and the other half stay as generated.

Hub datasets are left out: the test machines have no network, and a hub the server cannot reach
is answered 502 by design.
"""

from __future__ import annotations

import schemathesis
from hypothesis import strategies as st

_text = st.text(min_size=1, max_size=80).filter(str.strip)
_records = st.lists(st.tuples(_text, _text), min_size=1, max_size=3).map(
    lambda rows: [{"id": f"r{i}", "text": text, "reference": reference} for i, (text, reference) in enumerate(rows)]
)
_CHEAP = {"num_beams": 1, "min_length": 2, "max_length": 6}


@schemathesis.hook("flatmap_case").apply_to(path="/evaluate", method="POST")
def realistic_jobs(context, case):
    """Half of the positive job submissions become small runnable jobs."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return st.just(case)

    def as_job(records: list[dict]):
        case.body = {"dataset": {"records": records}, "generation": _CHEAP}
        return case

    return st.one_of(st.just(case), _records.map(as_job))


@schemathesis.hook("filter_body").apply_to(path="/evaluate", method="POST")
def no_hub_datasets(context, body) -> bool:
    """Drop bodies that would make the server download a dataset."""
    dataset = body.get("dataset") if isinstance(body, dict) else None
    return not (isinstance(dataset, dict) and dataset.get("hub") is not None)
