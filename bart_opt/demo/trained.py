"""The trained demo checkpoint shipped inside the package (``bart_opt/demo/model``)."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from bart_opt.demo.corpus import write_sample_records

# The checkpoint, and training.json: how it was trained (recipe, time, loss, validation ROUGE).
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "training.json")


def packaged_model_dir() -> Path:
    """Where the package keeps the trained demo checkpoint."""
    return Path(str(resources.files("bart_opt.demo") / "model"))


def write_demo_model(out_dir: str | Path, n_samples: int = 24, seed: int = 0) -> Path:
    """Copy the trained demo checkpoint into `out_dir` and write ``sample.jsonl`` beside it.

    Nothing is downloaded or trained: the files are the package's. ``sample.jsonl`` holds
    `n_samples` held-out stories (seed `seed`) the model never saw in training.
    Raises FileNotFoundError if the package was installed without its model files.
    """
    source = packaged_model_dir()
    missing = [name for name in MODEL_FILES if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(f"the trained demo model is incomplete (missing {', '.join(missing)}); "
                                "rebuild it with: python -m bart_opt.demo.train")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        shutil.copyfile(source / name, out / name)
    write_sample_records(out / "sample.jsonl", n=n_samples, seed=seed)
    return out
