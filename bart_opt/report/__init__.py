"""Reports of evaluation runs.

- `bart_opt.report.tables`: the tables of ``--format text|markdown|csv|latex`` (tabulate), from the dicts
  ``evaluate``, ``score`` and ``compare`` print;
- ``bart-opt report RUN... --out DIR``: `bart_opt.report.runs` reads the run folders,
  `bart_opt.report.plots` draws the PNG and SVG plots (matplotlib, the ``report`` extra),
  `bart_opt.report.card` builds the ``model-index`` block (huggingface_hub) and `bart_opt.report.write`
  writes them with ``report.md``.

Nothing here is imported by the package or the command line until a table or a report is asked for.
"""
