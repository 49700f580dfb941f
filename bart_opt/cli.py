"""The ``bart-opt`` command: summarize, evaluate, score, compare, report, demo-model, bench, check, serve.

Every subcommand reports bad input (a missing file, a missing column, a broken JSON
line, an unknown option value) as one line on stderr and exit status 2, with no
traceback. Heavy imports (torch models, the service) happen inside the subcommands.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path

from bart_opt import cluster
from bart_opt.cli_io import (
    FORMATS, CliError, finish_tracking, format_option, print_metrics, start_tracking, tracking_options,
)
from bart_opt.errors import InvalidRequest
from bart_opt.extras import MissingExtra, require
from bart_opt.engine.options import OptionConflict, add_cli_args, cli_flag, from_cli_args
from bart_opt.engine.spec import EARLY_STOPPING, REQUEST_OPTIONS

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEMO_NOTE = (
    "note: a tiny BART (about 1.4M parameters) trained for about 6 CPU-minutes on generated news stories; "
    "it summarizes stories like those in sample.jsonl (held out from training) and little else. "
    "Use it to try bart-opt offline; judge real summaries with a real checkpoint such as facebook/bart-large-cnn."
)
RANDOM_WARNING = (
    "note: this checkpoint has random weights; its summaries are meaningless. "
    "Use it to test the pipeline, not to judge summaries."
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: sys.argv[1:]); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("bench", "check"):
        # The benchmark and the self-check own their options; hand them over untouched.
        import importlib

        module = {"bench": "bart_opt.bench", "check": "bart_opt.bench.check"}[argv[0]]
        return importlib.import_module(module).main(argv[1:]) or 0
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        _validate_engine_options(args)
        return args.func(args) or 0
    except OptionConflict as error:
        print(f"bart-opt {args.command}: error: {error.naming(cli_flag)}", file=sys.stderr)
        return EXIT_USAGE
    except InvalidRequest as error:
        named = error.field in REQUEST_OPTIONS or error.field in vars(args)  # a field that is one of our options
        where = cli_flag(error.field) if named else error.field
        print(f"bart-opt {args.command}: error: {where}: {_one_line(error.message)}", file=sys.stderr)
        return EXIT_USAGE
    except (CliError, MissingExtra, ValueError, FileNotFoundError, OSError) as error:
        print(f"bart-opt {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        hint = "; rerun the same command to resume" if args.command == "evaluate" else ""
        print(f"bart-opt {args.command}: interrupted{hint}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _validate_engine_options(args: argparse.Namespace) -> None:
    """Refuse engine flags that exclude each other (``--exact --static``), or a device this machine lacks,
    before any record or weight is read (`bart_opt.engine.options.EngineOptions.validate`; with ``--ray`` only
    what holds on every machine: each replica checks its own)."""
    from bart_opt.pipeline.baselines import is_baseline

    if hasattr(args, "exact") and not is_baseline(args.model):
        from_cli_args(args).validate(here=getattr(args, "ray", None) is None)


def _one_line(error: BaseException | str) -> str:
    text = str(error) or type(error).__name__
    if isinstance(error, FileNotFoundError) and error.filename:
        text = f"no such file: {error.filename}"
    return " ".join(text.split())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from bart_opt import __version__

    parser = argparse.ArgumentParser(prog="bart-opt", description="Memory-optimized BART summarization.")
    parser.add_argument("--version", action="version", version=f"bart-opt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    summarize = sub.add_parser("summarize", help="summarize JSONL texts ({'text'} or {'id','text'}) to JSONL")
    _model_options(summarize)
    summarize.add_argument("input", nargs="?", default="-", help="JSONL file, or - for stdin (default)")
    summarize.add_argument("--text-column", default="text", help="field holding the text (default: text; "
                                                                 "demo-model/sample.jsonl's is article)")
    summarize.add_argument("--text-field", dest="text_column", action=_Renamed, help=argparse.SUPPRESS)
    _generation_options(summarize)
    summarize.set_defaults(func=cmd_summarize)

    evaluate = sub.add_parser("evaluate", help="summarize a dataset, score ROUGE, write predictions and metrics")
    _model_options(evaluate)
    evaluate.add_argument("--baselines", type=_names, default=(), metavar="NAMES",
                          help="comma-separated baselines to score beside the model, e.g. lead-3")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="local JSONL, JSON, CSV or Parquet file")
    source.add_argument("--dataset", help="hub dataset name, e.g. abisee/cnn_dailymail")
    evaluate.add_argument("--dataset-config", help="hub dataset config, e.g. 3.0.0")
    evaluate.add_argument("--split", default="test", help="hub dataset split (default: test)")
    evaluate.add_argument("--out", required=True, help="output directory (rerun into it to resume)")
    evaluate.add_argument("--overwrite", action="store_true",
                          help="delete an earlier run in --out and start over (a run on another dataset, "
                               "model or settings is refused otherwise)")
    evaluate.add_argument("--limit", type=int, help="evaluate only the first N records")
    evaluate.add_argument("--text-column", default="article", help="default: article")
    evaluate.add_argument("--summary-column", default="highlights", help="default: highlights")
    evaluate.add_argument("--id-column", default="id", help="default: id (row numbers when absent)")
    evaluate.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    format_option(evaluate)
    _rouge_options(evaluate)
    _metric_options(evaluate)
    _generation_options(evaluate)
    cluster.add_cli_args(evaluate)
    tracking_options(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)

    score = sub.add_parser("score", help="score another system's predictions (JSONL, JSON, CSV or Parquet) into a "
                                         "run folder that compare reads")
    score.add_argument("predictions", metavar="PREDICTIONS",
                       help="file of id, prediction and reference per example (format by extension)")
    score.add_argument("--out", required=True, help="output directory (run.json, predictions.jsonl, metrics.json)")
    score.add_argument("--references", metavar="FILE",
                       help="references in another file (id and reference columns), joined by id")
    score.add_argument("--id-column", default="id", help="default: id")
    score.add_argument("--prediction-column", default="prediction", help="default: prediction")
    score.add_argument("--reference-column", default="reference",
                       help="default: reference (a string, or a list of strings for several references)")
    score.add_argument("--name", help="how reports name the system (default: the file's name without extension)")
    score.add_argument("--overwrite", action="store_true", help="replace another run in --out")
    format_option(score)
    _rouge_options(score)
    _metric_options(score)
    tracking_options(score)
    score.set_defaults(func=cmd_score)

    compare = sub.add_parser("compare", help="compare evaluate runs on the same dataset, with significance tests")
    compare.add_argument("runs", nargs="+", metavar="RUN",
                         help="--out folders of bart-opt evaluate; the first is the baseline")
    compare.add_argument("--metric", default="rougeLsum",
                         help="ROUGE type that ranks the wins and losses (default: rougeLsum)")
    compare.add_argument("--resamples", type=int, default=1000,
                         help="bootstrap resamples and randomization trials (default: 1000)")
    compare.add_argument("--seed", type=int, default=0, help="seed of both tests (default: 0)")
    compare.add_argument("--top", type=int, default=5, help="wins and losses to show (default: 5)")
    printed = compare.add_mutually_exclusive_group()
    printed.add_argument("--format", choices=FORMATS, help="print the comparison as a table with a row per run and "
                                                           "metric score (text, markdown, csv, latex), or as JSON "
                                                           "(default: the text report with the examples won and lost)")
    printed.add_argument("--json", dest="format", action="store_const", const="json",
                         help="print the comparison as JSON (--format json)")
    compare.set_defaults(func=cmd_compare)

    report = sub.add_parser("report", help="plots, a Markdown summary and a model-index block of evaluate runs "
                                           "(pip install 'bart-opt[report]')")
    report.add_argument("runs", nargs="+", metavar="RUN",
                        help="--out folders of bart-opt evaluate or score; with two or more, on the same dataset, "
                             "the first is the baseline of the paired differences")
    report.add_argument("--out", required=True, help="output folder (report.md, model-index.yaml, PNG and SVG plots)")
    report.add_argument("--model-name", help="the model card's name (default: the first run that is a model's)")
    report.add_argument("--resamples", type=int, default=1000,
                        help="bootstrap resamples and randomization trials of the paired differences (default: 1000)")
    report.add_argument("--seed", type=int, default=0, help="seed of both tests (default: 0)")
    report.set_defaults(func=cmd_report)

    demo = sub.add_parser("demo-model", help="write the tiny trained demo checkpoint and held-out sample records")
    demo.add_argument("dir", help="output folder")
    demo.add_argument("--random", action="store_true",
                      help="write a random-weight checkpoint instead (meaningless summaries; for tests)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the sample records (and of --random's weights)")
    demo.set_defaults(func=cmd_demo_model)

    sub.add_parser("bench", help="engine benchmark (see bart-opt bench --help)", add_help=False)
    sub.add_parser("check", help="offline self-check of this machine: parity, OOM split, memory, service "
                                 "(see bart-opt check --help)", add_help=False)

    serve = sub.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--model", help="checkpoint folder or hub id (default: the service's setting)")
    serve.add_argument("--host", help="default: the service's setting (127.0.0.1)")
    serve.add_argument("--port", type=int, help="default: the service's setting")
    serve.set_defaults(func=cmd_serve)
    return parser


class _Renamed(argparse.Action):
    """An option's old spelling: accepted, with a warning naming the new one (``--text-field`` -> ``--text-column``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        new = "--" + self.dest.replace("_", "-")
        print(f"bart-opt: warning: {option_string} is now {new}; the old spelling still works", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _rouge_options(parser: argparse.ArgumentParser) -> None:
    from bart_opt.pipeline.rouge_text import TOKENIZERS

    group = parser.add_argument_group("ROUGE (docs/evaluation.md#rouge-in-any-language)")
    group.add_argument("--rouge-tokenizer", choices=TOKENIZERS, default="default",
                       help="default: rouge-score's (a-z and 0-9 only: English); unicode: Unicode words; script: "
                            "Unicode words, and characters of scripts written without spaces (Chinese, Japanese, "
                            "Thai)")
    group.add_argument("--rouge-lang", default="en", metavar="LANG",
                       help="ISO 639-1 code of the texts' language: its stemmer (Porter for en, Snowball where nltk "
                            "has one, else none) and its rougeLsum sentence splitting (default: en)")


def _metric_options(parser: argparse.ArgumentParser) -> None:
    from bart_opt.scoring.registry import DEFAULT, NAMES

    group = parser.add_argument_group("metrics (docs/evaluation.md#metrics-beyond-rouge)")
    group.add_argument("--metrics", default=",".join(DEFAULT), metavar="NAMES",
                       help=f"comma list of {', '.join(NAMES)} (default: {','.join(DEFAULT)}: no model); ROUGE is "
                            "always scored")
    group.add_argument("--bertscore-model", metavar="DIR_OR_ID", help="the checkpoint --metrics bertscore runs")
    group.add_argument("--consistency-model", metavar="DIR_OR_ID",
                       help="the NLI checkpoint --metrics consistency runs")


def metric_settings(args: argparse.Namespace, rouge):
    """The command's `bart_opt.scoring.registry.MetricSettings` (words and sentences in ROUGE's language);
    `InvalidRequest` naming ``metrics``, ``bertscore_model`` or ``consistency_model``."""
    from bart_opt.scoring.registry import MODEL_METRICS, MetricSettings, parse_metrics

    device = getattr(args, "device", None) or "auto"
    if device == "auto":  # the engine's rule: CUDA when there is one, for the model metrics only
        models = set(parse_metrics(args.metrics)) & set(MODEL_METRICS)
        device = "cuda" if models and __import__("torch").cuda.is_available() else "cpu"
    return MetricSettings.for_rouge(rouge, args.metrics, bertscore_model=args.bertscore_model,
                                    consistency_model=args.consistency_model, device=device)


def rouge_settings(args: argparse.Namespace):
    """The command's `bart_opt.pipeline.rouge.RougeSettings`; `InvalidRequest` naming ``rouge_tokenizer`` or
    ``rouge_lang``."""
    from bart_opt.pipeline.rouge import RougeSettings

    try:
        return RougeSettings(tokenizer=args.rouge_tokenizer, lang=args.rouge_lang)
    except InvalidRequest as error:
        raise InvalidRequest(f"rouge_{error.field}", error.message) from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (--model also takes a baseline: lead-3)")
    add_cli_args(group)


def _generation_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("generation (default: the checkpoint's generation config)")
    for name, option in REQUEST_OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        if option.kind == "early_stopping":
            group.add_argument(flag, choices=list(_EARLY_STOPPING), help=option.help)
        else:
            group.add_argument(flag, type=int if option.kind == "count" else float, help=option.help)


_EARLY_STOPPING = {str(value).lower(): value for value in EARLY_STOPPING}  # "true" -> True, "never" -> "never"


def generation_kwargs(args: argparse.Namespace) -> dict:
    """Generation overrides given on the command line (unset options left out)."""
    kwargs = {name: getattr(args, name) for name in REQUEST_OPTIONS if getattr(args, name) is not None}
    if "early_stopping" in kwargs:
        kwargs["early_stopping"] = _EARLY_STOPPING[kwargs["early_stopping"]]
    return kwargs


def load_summarizer(args: argparse.Namespace):
    """The `Summarizer` of the command's model options (`bart_opt.engine.options.EngineOptions`)."""
    from bart_opt.pipeline.summarizer import Summarizer

    return Summarizer.from_options(from_cli_args(args))


def read_jsonl_texts(lines: Iterable[str], source: str, text_field: str) -> tuple[list, list[str]]:
    """Ids (None where absent) and texts from JSON lines; blank lines are skipped."""
    ids, texts = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise CliError(f"{source} line {number}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict) or text_field not in row:
            found = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
            hint = "; pick one with --text-column" if isinstance(row, dict) and row else ""
            raise CliError(f"{source} line {number}: no {text_field!r} field (found: {found or 'nothing'}){hint}")
        if not isinstance(row[text_field], str):
            raise CliError(f"{source} line {number}: {text_field!r} must be a string")
        ids.append(row.get("id"))
        texts.append(row[text_field])
    if not texts:
        raise CliError(f"{source} holds no texts")
    return ids, texts


def cmd_summarize(args: argparse.Namespace) -> int:
    """Summarize JSONL texts and print one JSON line per text, in input order."""
    from bart_opt.pipeline.baselines import baseline_summary, is_baseline

    if args.input == "-":
        ids, texts = read_jsonl_texts(sys.stdin, "stdin", args.text_column)
    else:
        path = Path(args.input)
        if not path.is_file():
            raise CliError(f"no such file: {path}")
        with path.open(encoding="utf-8") as f:
            ids, texts = read_jsonl_texts(f, str(path), args.text_column)
    if is_baseline(args.model):
        _refuse_generation_options(args)
        rows = [{"summary": baseline_summary(args.model, text)} for text in texts]
    else:
        summarizer = load_summarizer(args)
        result = summarizer.summarize(texts, generation=summarizer.generation_spec(generation_kwargs(args)))
        rows = [{"summary": summary, "input_tokens": item["input_tokens"], "truncated": item["truncated"],
                 "output_tokens": item["output_tokens"], **({"error": error} if error is not None else {})}
                for summary, item, error in zip(result.summaries, result.items, result.errors)]
    for record_id, row in zip(ids, rows):
        if record_id is not None:
            row = {"id": record_id, **row}
        print(json.dumps(row, ensure_ascii=False))
    return 0


def _refuse_generation_options(args: argparse.Namespace) -> None:
    if generation_kwargs(args):
        options = ", ".join("--" + name.replace("_", "-") for name in generation_kwargs(args))
        raise CliError(f"{args.model} is a baseline: generation options ({options}) do not apply")


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Run (or resume) an evaluation into --out, print its metrics as JSON and its ROUGE lines on stderr.

    ``--model lead-3`` evaluates the baseline itself (CPU, no checkpoint);
    ``--baselines lead-3`` scores the baseline beside a model on the same records.
    """
    from bart_opt.pipeline.baselines import check_baselines, is_baseline
    from bart_opt.pipeline.data import load_records
    from bart_opt.evaluate import FailureStreak, run_baseline_evaluation, run_evaluation
    from bart_opt.evaluate.stored import check_run_folder

    baselines = check_baselines(args.baselines)
    rouge = rouge_settings(args)
    chosen = metric_settings(args, rouge)
    if is_baseline(args.model):
        _refuse_generation_options(args)
        if baselines:
            raise CliError(f"--baselines compares a model with baselines; {args.model} is a baseline itself")
    if args.data is not None and not Path(args.data).is_file():
        raise CliError(f"no such file: {args.data}")
    check_run_folder(args.out, overwrite=args.overwrite)  # the stored rows and files, before the model loads
    tracker = start_tracking(args)  # an unreachable tracking server is refused before any work
    with tracker.ended_on_error() if tracker is not None else nullcontext():
        records = load_records(
            hub=args.dataset, config=args.dataset_config, split=args.split, file=args.data,
            text_column=args.text_column, summary_column=args.summary_column, id_column=args.id_column,
            limit=args.limit,
        )
        source = args.data if args.data is not None else " ".join(
            part for part in (args.dataset, args.dataset_config, args.split) if part)
        on_progress = tracker.progress if tracker is not None else None
        try:
            if is_baseline(args.model):
                if args.ray is not None:
                    raise CliError(f"{args.model} is a baseline: --ray does not apply")
                metrics = run_baseline_evaluation(args.model, records, args.out, rouge.scorer(), source=source,
                                                  overwrite=args.overwrite, metrics=chosen)
            elif args.ray is not None:
                metrics = evaluate_on_ray(args, records, source, baselines, rouge, on_progress=on_progress,
                                          metrics=chosen)
            else:
                for option in cluster.flag_fields()[1:]:
                    if getattr(args, cluster.dest_of(option)) is not None:
                        raise CliError(f"{option.metadata['flag']} needs --ray")
                metrics = run_evaluation(load_summarizer(args), records, args.out, generation_kwargs(args),
                                         progress=not args.no_progress, on_progress=on_progress, source=source,
                                         overwrite=args.overwrite, baselines=baselines, rouge=rouge,
                                         metrics=chosen)
        except FailureStreak as error:
            raise CliError(f"{error}; the predictions made so far are kept in {args.out} (the log above has the "
                           "reasons)") from error
    print_metrics(metrics, args.format)
    finish_tracking(tracker, args)
    return 0


def evaluate_on_ray(args: argparse.Namespace, records: list, source: str, baselines: Sequence[str] = (),
                    rouge=None, on_progress: Callable[[int, int], None] | None = None, metrics=None) -> dict:
    """`cmd_evaluate` with replicas of the model on a Ray cluster, writing the same run folder
    (with `baselines` scored beside it, and `on_progress` told as `run_evaluation` tells it)."""
    try:
        from bart_opt.distributed import ClusterError, ReplicaPool
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "ray":
            raise
        raise CliError("--ray needs Ray: pip install 'bart-opt[ray]'") from None
    from bart_opt.evaluate import run_evaluation
    from bart_opt.engine.loading import resolve_checkpoint

    for option, instead in (("device", "replicas run on a GPU with --gpus-per-replica, else on the CPU"),
                            ("torch_threads", "give replicas threads with --threads-per-replica")):
        if getattr(args, option) is not None:
            raise CliError(f"--{option.replace('_', '-')} does not apply with --ray: {instead}")
    options = cluster.from_cli_args(args)
    config = from_cli_args(args)
    resolve_checkpoint(config.model)  # a missing checkpoint is this command's error, not a replica's
    pool = ReplicaPool(config, options, name=args.model,
                       on_status=lambda message: print(f"bart-opt evaluate: {message}", file=sys.stderr))
    try:
        pool.start()  # a cluster that cannot hold the replicas is refused before the run folder is touched
        metrics = run_evaluation(pool, records, args.out, generation_kwargs(args), progress=not args.no_progress,
                                 on_progress=on_progress, source=source, overwrite=args.overwrite,
                                 baselines=baselines, rouge=rouge, metrics=metrics)
    except ClusterError as error:
        cause = f" ({_one_line(error.__cause__)})" if error.__cause__ is not None else ""
        raise CliError(f"{error}{cause}; the predictions made so far are kept: rerun to resume") from error
    if pool.placement is not None:
        started = ", ".join(f"{key} {value:.1f} s" for key, value in pool.timings.items())
        print(f"bart-opt evaluate: Ray: {pool.placement.describe()}; {started}", file=sys.stderr)
    return metrics


def cmd_score(args: argparse.Namespace) -> int:
    """Score a predictions file into --out (`bart_opt.evaluate.external`), print its metrics as JSON and its
    ROUGE lines on stderr, as evaluate does."""
    from bart_opt.evaluate.external import Columns, run_scoring

    rouge = rouge_settings(args)
    chosen = metric_settings(args, rouge)
    for name in (args.predictions, args.references):
        if name is not None and not Path(name).is_file():
            raise CliError(f"no such file: {name}")
    columns = Columns(id=args.id_column, prediction=args.prediction_column, reference=args.reference_column)
    tracker = start_tracking(args)
    with tracker.ended_on_error() if tracker is not None else nullcontext():
        metrics = run_scoring(args.predictions, args.out, rouge=rouge, columns=columns, references=args.references,
                              name=args.name, overwrite=args.overwrite, metrics=chosen)
    print_metrics(metrics, args.format, ensure_ascii=False)
    finish_tracking(tracker, args)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare run folders (the first is the baseline) and print the text report, JSON (--json, --format json) or
    the significance table in another --format."""
    from bart_opt.compare import compare_runs, format_report, load_run

    if len(args.runs) < 2:
        raise CliError("give at least two run folders")
    runs = [load_run(folder) for folder in args.runs]
    result = compare_runs(runs, metric=args.metric, resamples=args.resamples, seed=args.seed, top=args.top)
    if args.format is None:
        print(format_report(result))
    elif args.format == "json":
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        from bart_opt.report.tables import comparison_table, render

        print(render(comparison_table(result), args.format))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write the plots, report.md and model-index.yaml of run folders into --out (`bart_opt.report.write`)."""
    try:
        import matplotlib  # noqa: F401  (checked here: the plots import it only as they draw)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "matplotlib":
            raise
        raise CliError("the plots need matplotlib: pip install 'bart-opt[report]'") from None
    from bart_opt.report.write import write_report

    written = write_report(args.runs, args.out, model_name=args.model_name, resamples=args.resamples, seed=args.seed)
    for path in written:
        print(path)
    return 0


def cmd_demo_model(args: argparse.Namespace) -> int:
    """Write the trained demo checkpoint (or, with --random, a random one) and held-out sample records."""
    from bart_opt.demo import build_checkpoint, write_demo_model, write_sample_records

    if args.random:
        path = build_checkpoint(args.dir, seed=args.seed, init_std=0.2)
        sample = write_sample_records(path / "sample.jsonl", seed=args.seed)
        print(f"wrote a random demo BART checkpoint to {path}")
    else:
        path = write_demo_model(args.dir, seed=args.seed)
        sample = path / "sample.jsonl"
        print(f"wrote the trained demo BART checkpoint to {path}")
    print(f"wrote {sample} (24 held-out news-like records) for: "
          f"bart-opt evaluate --model {path} --data {sample} --out runs/demo --baselines lead-3")
    print(RANDOM_WARNING if args.random else DEMO_NOTE)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Start the HTTP service (imported only here: bart_opt never imports FastAPI otherwise).

    Options left out come from the service's settings (``BART_OPT_*`` environment variables).
    Without the serve extra, `MissingExtra` names it (exit 2) before anything is imported.
    """
    require("serve", "the service")
    from pydantic import ValidationError

    from app.settings import setting_name

    try:
        from app.server import serve  # app.main reads the settings from the environment as it is imported

        serve(model=args.model, host=args.host, port=args.port)
    except ValidationError as error:  # refused settings: their own sentences, without pydantic's frame
        problems = []
        for problem in error.errors():
            message, where = str(problem["msg"]).removeprefix("Value error, "), problem["loc"]
            named = not where or message.startswith("BART_OPT_")
            problems.append(message if named else f"{setting_name(str(where[0]))}: {message}")
        raise CliError("; ".join(problems)) from None
    return 0


def entry() -> None:
    """The ``bart-opt`` command (and ``python -m bart_opt.cli``): `main`, then exit with its status.

    A command that joined a Ray cluster (``evaluate --ray``, ``serve`` with jobs on Ray) ends
    through `bart_opt.distributed.exit_process`, however `main` ended (a status, an exception,
    Ray's SIGTERM handler): Ray's shutdown can hang, at interpreter exit too, so it is waited for
    at most `bart_opt.distributed.SHUTDOWN_TIMEOUT_S` and the process then exits at once.
    """
    try:
        code = main()
    except BaseException as error:
        if not _joined_ray():
            raise
        code = _status_of(error)
    if _joined_ray():
        sys.modules["bart_opt.distributed"].exit_process(code, "bart-opt")
    sys.exit(code)


def _joined_ray() -> bool:
    distributed = sys.modules.get("bart_opt.distributed")
    return distributed is not None and distributed.ray.is_initialized()


def _status_of(error: BaseException) -> int:
    """The exit status an uncaught `error` gives (a traceback is printed for a crash)."""
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    traceback.print_exception(error)
    return 1


if __name__ == "__main__":
    entry()
