"""``bart-opt bench --peers ctranslate2``: bart_opt against other engines on a CNN-like workload.

The workload: one checkpoint (random weights of a named shape, bart-base by default, with the
end-of-sequence logit raised so that summaries end at varied, realistic lengths; or a real
folder with ``--model``), 12 documents of CNN/DailyMail-like length (453 to 1024 tokens) in one
batch, generated at the CNN settings (4 beams, length_penalty 2.0, min_length 56, max_length
142, no_repeat_ngram_size 3). Engines: transformers float32 (the reference), bart_opt float32
and bfloat16, bart_opt's fast mode in bfloat16 (``bart_opt_fast``), bart_opt int8 (``quantize="int8"``,
float32 elsewhere) and, where bfloat16 is native, its fastest combination (int8 and the fast mode
in bfloat16), and each peer (CTranslate2 float32 and int8).

The processor is named above the table: its model, the ISA torch runs on and the flags that decide
which modes are fast (`bart_opt.engine.hardware`). ``--isa avx2`` limits every engine's libraries to AVX2
(`bart_opt.bench.isa`), and before any engine runs, a probe process with the same environment
reads from each library which ISA it runs on; a library that did not keep to the limit stops the
run.

Each engine runs in a process of its own with the same thread count, so that its memory can be
measured the same way whatever allocates it: the peak RSS of one generate call above the RSS
before the call (weights loaded, inputs built), read from the kernel's exact high-water mark
(:func:`bart_opt.engine.memory.peak_rss_bytes`, reset just before the call). RSS is the one measure that
sees every allocator alike (torch's, CTranslate2's, the Python heap); torch's live tensor bytes, which
``bart-opt bench`` without ``--peers`` reports for transformers and bart_opt, would leave CTranslate2
out, and counting them triples transformers' run time here. That first call, untimed, also warms
the engine up; then the engines take turns for ``--repeats`` timed
calls each, so that a busy machine slows them alike, and the best time and the spread of the
runs are reported, with the CPU time of the best run (all threads: on a shared machine it moves
less than wall time). Outputs are compared token for token with transformers float32.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bart_opt.engine import hardware
from bart_opt.engine.memory import format_bytes
from bart_opt.bench.engines import EngineSpec

# Token counts of 12 CNN/DailyMail-like articles after truncation to 1024 (9,537 tokens in all).
CNN_DOC_LENGTHS = (1024, 1024, 1024, 1024, 951, 868, 780, 712, 640, 575, 462, 453)
PEER_DTYPES = {"ctranslate2": ("float32", "int8")}
OURS = (EngineSpec("bart_opt", "float32"), EngineSpec("bart_opt", "bfloat16"), EngineSpec("bart_opt_fast", "bfloat16"),
        EngineSpec("bart_opt", "int8"))
FASTEST = EngineSpec("bart_opt_fast", "int8+bfloat16")  # where bfloat16 is native; else int8 is the fastest
REFERENCE = EngineSpec("transformers", "float32")


def engine_specs(peers: list[str], native_bf16: bool = True) -> list[EngineSpec]:
    """The reference, bart_opt in both dtypes, its fast mode and int8 (and where bfloat16 is native, int8
    with the fast mode in bfloat16), then every dtype of each peer."""
    ours = [*OURS, *([FASTEST] if native_bf16 else [])]
    return [REFERENCE, *ours, *(EngineSpec(p, d) for p in peers for d in PEER_DTYPES[p])]


def doc_lengths(count: int, max_len: int) -> list[int]:
    """`count` CNN-like lengths scaled so that the longest is `max_len` (cycling past 12)."""
    return [max(3, round(CNN_DOC_LENGTHS[i % len(CNN_DOC_LENGTHS)] * max_len / 1024)) for i in range(count)]


def make_docs(config, count: int, max_len: int, seed: int) -> list[list[int]]:
    """Random token ids, bos ... eos like a tokenizer's output, of :func:`doc_lengths`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    docs = []
    for n in doc_lengths(count, max_len):
        ids = torch.randint(4, config.vocab_size, (n,), generator=gen)
        ids[0], ids[-1] = config.bos_token_id, config.eos_token_id
        docs.append(ids.tolist())
    return docs


class Worker:
    """One engine in its own process, driven over a pipe (``python -m bart_opt.bench.vs_peers JOB``)."""

    def __init__(self, spec: EngineSpec, job: dict):
        self.spec = spec
        env = {**os.environ, **job.get("env", {}), "OMP_NUM_THREADS": str(job["threads"]),
               "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bart_opt.bench.vs_peers", json.dumps({**job, "engine": vars(spec)})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        self.first = self._receive()  # sent after loading and the memory run

    def _receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.spec.label} worker exited with status {self.proc.wait()} (see its stderr above)")
        return json.loads(line)

    def run(self) -> dict:
        """One timed generate call: ``{"seconds", "cpu_seconds", "same_as_first"}``."""
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._receive()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _worker_main(job: dict) -> None:
    """Load one engine, measure one call's memory, then answer ``run`` lines until stdin closes."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr; the pipe carries only replies
    sys.stdout = sys.stderr
    import torch

    from bart_opt.engine.memory import peak_rss_bytes, reset_peak_rss, rss_bytes
    from bart_opt.bench.engines import load_engine

    torch.set_num_threads(job["threads"])
    spec = EngineSpec(**job["engine"])
    # Imports first, so that the RSS they add counts neither as loaded weights nor in the peak.
    import transformers.models.bart.modeling_bart  # noqa: F401  (every engine reads the config with it)

    if spec.name == "ctranslate2":
        import ctranslate2  # noqa: F401
    start_rss = rss_bytes()
    engine = load_engine(spec, job["folder"], job["generation"], job["threads"], job.get("ct2_folder"))
    if spec.name != "ctranslate2":
        # safetensors weights are memory-mapped: read every page now, or the first call would page them
        # in and count them in its peak.
        for tensor in engine.model.state_dict().values():
            tensor.sum()
    engine.prepare(json.loads(Path(job["inputs"]).read_text()))
    gc.collect()
    loaded_rss = rss_bytes()
    exact_peak = reset_peak_rss()
    start, cpu_start = time.perf_counter(), time.process_time()
    first = engine.generate()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak = peak_rss_bytes()

    def send(message: dict) -> None:
        reply.write(json.dumps(message) + "\n")
        reply.flush()

    send({"outputs": first, "memory_run_seconds": seconds, "memory_run_cpu_seconds": cpu_seconds,
          "loaded_bytes": loaded_rss - start_rss,
          "peak_rss_bytes": peak - loaded_rss, "peak_rss_source": "VmHWM reset" if exact_peak else "VmHWM since start",
          "torch_isa": torch.backends.cpu.get_cpu_capability()})
    for line in sys.stdin:
        if line.strip() == "run":
            start, cpu_start = time.perf_counter(), time.process_time()
            out = engine.generate()
            send({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start,
                  "same_as_first": out == first})


def result_row(spec: EngineSpec, first: dict, runs: list[dict], reference: list[list[int]]) -> dict:
    """The table row of one engine from its worker's replies; outputs compared with `reference`."""
    outputs = first["outputs"]
    seconds = [r["seconds"] for r in runs] or [first["memory_run_seconds"]]  # --repeats 0: the memory run's
    best = min(seconds)
    cpu = [r["cpu_seconds"] for r in runs] or [first["memory_run_cpu_seconds"]]
    generated = sum(len(seq) - 1 for seq in outputs)  # tokens after the decoder start token
    same = [a == b for a, b in zip(outputs, reference)]
    return {
        "engine": spec.name, "dtype": spec.dtype, "label": spec.label,
        "seconds": best, "seconds_runs": seconds, "spread": max(seconds) - best, "timed_runs": len(runs),
        "cpu_seconds": min(cpu), "cpu_seconds_runs": cpu,
        "docs": len(outputs), "docs_per_s": len(outputs) / best, "generated_tokens": generated,
        "tokens_per_s": generated / best, "output_lengths": [len(seq) for seq in outputs],
        "loaded_bytes": first["loaded_bytes"], "peak_rss_bytes": first["peak_rss_bytes"],
        "peak_rss_source": first["peak_rss_source"], "torch_isa": first.get("torch_isa"),
        "identical_to_reference": sum(same), "identical_docs": same,
        "deterministic": all(r["same_as_first"] for r in runs),
    }


def targets(rows: list[dict], native_bf16: bool = True) -> dict:
    """The speed ratios the issue sets targets for, where both engines ran: bart_opt float32 against
    CTranslate2 float32 (>= 1.0x, with 12/12 identical to transformers), and bart_opt's fastest row
    against CTranslate2 int8 (>= 1.5x where bfloat16 is native, >= 1.3x elsewhere)."""
    by = {(r["engine"], r["dtype"]): r for r in rows}
    out = {}
    ours32, peer32, peer8 = ("bart_opt", "float32"), ("ctranslate2", "float32"), ("ctranslate2", "int8")
    if ours32 in by and peer32 in by:
        ratio = by[peer32]["seconds"] / by[ours32]["seconds"]
        identical = by[ours32]["identical_to_reference"] == by[ours32]["docs"]
        out["bart_opt_float32_vs_ctranslate2_float32"] = {"speed_ratio": ratio, "target": 1.0,
                                                          "met": ratio >= 1.0 and identical}
    ours = [r for r in rows if r["engine"].startswith("bart_opt")]
    if ours and peer8 in by:
        fastest = min(ours, key=lambda r: r["seconds"])
        goal = 1.5 if native_bf16 else 1.3
        ratio = by[peer8]["seconds"] / fastest["seconds"]
        out["bart_opt_fastest_vs_ctranslate2_int8"] = {"speed_ratio": ratio, "target": goal, "met": ratio >= goal,
                                                       "engine": fastest["label"]}
    return out


def format_table(config: dict, rows: list[dict]) -> str:
    """Markdown: the processor, one row per engine, then the target ratios."""
    ref = next(r for r in rows if (r["engine"], r["dtype"]) == (REFERENCE.name, REFERENCE.dtype))
    lines = [
        isa_line(config["cpu"], config["isa"], config["libraries"]),
        f"### bart-opt bench --peers: {config['model']}, {config['docs']} documents of {config['min_doc_len']}-"
        f"{config['max_doc_len']} tokens ({config['input_tokens']} in all), {config['threads']} thread(s) each",
        f"CNN settings: {config['settings_text']}; time = "
        + (f"best of {config['repeats']} timed run(s), engines taking turns" if config["repeats"]
           else "the first (memory) run, engines one after the other")
        + "; memory = peak RSS of the first call above the RSS with weights and inputs loaded (own process "
        "per engine)",
        "",
        "| engine | dtype | seconds (best) | spread of runs | CPU seconds (best) | docs/s | generated tokens/s "
        "| speed vs transformers | RSS of weights+inputs | peak RSS above that | same ids as transformers fp32 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        runs = r["seconds_runs"]
        spread = f"{min(runs):.2f}-{max(runs):.2f}" if len(runs) > 1 else "1 run"
        lines.append(
            f"| {r['engine']} | {r['dtype']} | {r['seconds']:.2f} | {spread} | {r['cpu_seconds']:.2f} | {r['docs_per_s']:.3f} | "
            f"{r['tokens_per_s']:.1f} | {ref['seconds'] / r['seconds']:.2f}x | {format_bytes(r['loaded_bytes'])} | "
            f"{format_bytes(r['peak_rss_bytes'])} | {r['identical_to_reference']}/{r['docs']} |"
        )
    goals = targets(rows, config["cpu"]["native_bf16"])
    if goals:
        lines += ["", "| target | speed ratio | goal | met |", "|---|---:|---:|---|"]
        for name, t in goals.items():
            label = f"{name} ({t['engine']})" if "engine" in t else name
            lines.append(f"| {label} | {t['speed_ratio']:.2f}x | >= {t['target']:.1f}x | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines)


def isa_line(cpu: dict, isa: str, libraries: dict[str, str]) -> str:
    """The processor above the table: model, the ISA the engines ran on, the flags, and each library's own word."""
    flags = ", ".join(f"{flag} {'yes' if flag in cpu['flags'] else 'no'}" for flag in hardware.FLAGS)
    limit = "limited to AVX2 in every engine" if isa == "avx2" else "no limit"
    return (f"CPU: {cpu['model'] or 'unknown'}; ISA {cpu['isa']} ({limit}); flags {flags}; libraries: "
            + ", ".join(f"{lib} {value}" for lib, value in libraries.items()))


def run(args) -> int:
    """The peer comparison for ``bart-opt bench --peers`` (options parsed by bench.py); exit status."""
    from transformers import BartConfig

    from bart_opt.bench import isa
    from bart_opt.bench.workloads import CNN_SETTINGS, build_random_checkpoint
    from bart_opt.bench.engines import checkpoint_settings, convert_to_ct2, ct2_options

    every = [s.label for s in engine_specs(args.peers)]
    unknown = sorted(set(args.engines or ()) - set(every))
    if unknown or (args.engines and REFERENCE.label not in args.engines):
        print(f"bart-opt bench: --engines takes {REFERENCE.label!r} (the reference) and rows among {every}; "
              f"unknown: {unknown}", file=sys.stderr)
        return 2
    cnn_settings = dict(CNN_SETTINGS)
    env = isa.isa_env(args.isa)
    with tempfile.TemporaryDirectory(prefix="bart-opt-peers-") as tmp:
        folder = args.model or build_random_checkpoint(tmp, args.size, args.seed, args.eos_bias)
        try:
            cfg = BartConfig.from_pretrained(folder)
        except (OSError, ValueError) as exc:
            print(f"bart-opt bench: cannot load {folder}: {exc}", file=sys.stderr)
            return 2
        max_len = min(args.max_len, cfg.max_position_embeddings)
        docs = make_docs(cfg, args.docs, max_len, args.seed)
        inputs = Path(tmp, "inputs.json")
        inputs.write_text(json.dumps(docs))
        job = {"folder": folder, "inputs": str(inputs), "generation": cnn_settings, "threads": args.threads, "env": env}
        if "ctranslate2" in args.peers:
            print("converting the checkpoint for CTranslate2 ...", file=sys.stderr, flush=True)
            job["ct2_folder"] = convert_to_ct2(folder, str(Path(tmp, "ctranslate2")))
        libraries, cpu = isa.report(env, job.get("ct2_folder"))
        print(isa_line(cpu, args.isa, libraries), file=sys.stderr, flush=True)
        missed = isa.unmet(libraries, args.isa)
        if missed:
            print(f"bart-opt bench: --isa {args.isa} did not take effect: {'; '.join(missed)}", file=sys.stderr)
            return 2
        # The fastest combination's row only where bfloat16 is native (under the limits, if any).
        specs = [s for s in engine_specs(args.peers, cpu["native_bf16"]) if not args.engines or s.label in args.engines]
        workers = []
        try:
            for spec in specs:
                print(f"loading {spec.label} and measuring one call ...", file=sys.stderr, flush=True)
                workers.append(Worker(spec, job))
            runs = {w.spec: [] for w in workers}
            for repeat in range(args.repeats):
                for w in workers:
                    runs[w.spec].append(w.run())
                    print(f"  run {repeat + 1}: {w.spec.label} {runs[w.spec][-1]['seconds']:.2f} s", file=sys.stderr)
        finally:
            for w in workers:
                w.close()
        settings = checkpoint_settings(folder, cnn_settings)
    reference = workers[0].first["outputs"]
    rows = [result_row(w.spec, w.first, runs[w.spec], reference) for w in workers]
    lengths = [len(d) for d in docs]
    config = {
        "model": args.model or f"random {args.size} (eos bias {args.eos_bias})", "docs": len(docs),
        "doc_lengths": lengths, "min_doc_len": min(lengths), "max_doc_len": max(lengths), "input_tokens": sum(lengths),
        "padded_positions": len(docs) * max(lengths), "threads": args.threads, "repeats": args.repeats,
        "generation": cnn_settings, "settings_text": ", ".join(f"{k} {v}" for k, v in cnn_settings.items()),
        "ctranslate2_options": ct2_options(settings) if "ctranslate2" in args.peers else None,
        "versions": _versions(args.peers), "isa": args.isa, "env": env, "cpu": cpu, "libraries": libraries,
    }
    print(format_table(config, rows))
    if args.json_path:
        payload = {"config": config, "results": rows, "targets": targets(rows, cpu["native_bf16"])}
        Path(args.json_path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


def _versions(peers: list[str]) -> dict:
    import importlib.metadata as md

    return {name: md.version(name) for name in ("torch", "transformers", *peers)}


if __name__ == "__main__":
    _worker_main(json.loads(sys.argv[1]))
