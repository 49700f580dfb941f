# bart-opt HTTP service. Build and run (docs/docker.md has the whole story: volumes, settings, sizes):
#   docker build -t bart-opt .                                        # CUDA: on the PyTorch image below
#   docker run --gpus all -p 8000:8000 -v bart-opt-hf:/cache/huggingface -v bart-opt-jobs:/var/lib/bart-opt bart-opt
# A CPU image: any base with python3 (3.11+), python3-venv and apt, e.g. Debian's (tests/docker/base.py):
#   docker build --build-arg BASE=localhost/bart-opt-base:bookworm -t bart-opt-cpu .
#
# The default base carries torch 2.13.0 (CUDA 12.6): transformers 5.24 turns torch off below 2.6, which
# ruled out the 2.5.1 image this file used to name; the build below checks it (see docs/docker.md).
ARG BASE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
FROM ${BASE}

# Installed only where the base has no torch: the version the project is tested with. PyPI's default
# build of it is the CUDA one (several GB); the CPU build comes from pip's find-links folder or from
# --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
ARG TORCH=torch==2.13.0
ARG PIP_EXTRA_INDEX_URL

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/cache/huggingface \
    BART_OPT_DB=/var/lib/bart-opt/jobs.db \
    BART_OPT_DATA_DIR=/data \
    BART_OPT_HOST=0.0.0.0 \
    BART_OPT_PORT=8000 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# g++ and the Python headers build the fast mode's CPU attention kernel on first use (bart_opt/engine/csrc;
# without them the fast mode falls back to torch's kernel). The PyTorch image's python has its headers;
# Debian's are in libpython3-dev.
RUN packages=g++; \
    python3 -c 'import os, sysconfig; os.stat(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
      2>/dev/null || packages="$packages libpython3-dev"; \
    apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# A venv: Debian's python refuses system-wide installs (PEP 668). Where the base has torch, the venv
# sees the base's packages, so its (CUDA) torch is used as it is.
RUN if python3 -c "import torch" 2>/dev/null; then \
      python3 -m venv --system-site-packages "$VIRTUAL_ENV"; \
    else \
      python3 -m venv "$VIRTUAL_ENV" && pip install "$TORCH"; \
    fi

WORKDIR /opt/bart-opt
# The dependencies first, from pyproject.toml alone, so a change to the code does not reinstall them: the
# core's and those of the extras the image runs: serve (the service), fast (ninja, which builds the kernel with
# the g++ above) and postgres (for BART_OPT_DB=postgresql://..., issue 28).
COPY pyproject.toml ./
RUN python -c 'import tomllib; project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
      extras = project["optional-dependencies"]; \
      print("\n".join(project["dependencies"] + [r for e in ("serve", "fast", "postgres") for r in extras[e]]))' \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
COPY README.md ./
COPY bart_opt ./bart_opt
COPY app ./app
RUN pip install --no-deps . \
 && python -c 'import sys, torch, transformers; from transformers.utils import is_torch_available; \
      is_torch_available() or sys.exit(f"transformers {transformers.__version__} cannot use torch {torch.__version__}" \
                                       " (it needs 2.6 or newer): choose another BASE")' \
 && useradd --create-home --uid 10001 bartopt \
 && mkdir -p /cache/huggingface /var/lib/bart-opt /data \
 && chown bartopt /cache/huggingface /var/lib/bart-opt

USER bartopt
# Model downloads (facebook/bart-large-cnn on first start) and the jobs' SQLite database: keep both on
# volumes. Files for POST /evaluate {"dataset": {"file": ...}} are read from /data (mount it read-only).
VOLUME ["/cache/huggingface", "/var/lib/bart-opt"]
EXPOSE 8000

# /health answers while the model loads; the start period covers a first download. The port is the
# server's own (BART_OPT_PORT), so `-e BART_OPT_PORT=...` moves both.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"BART_OPT_PORT\"]}/health', timeout=4)"

# SIGTERM (docker stop) drains the requests in flight and exits 0; give it time: docker stop -t 60.
STOPSIGNAL SIGTERM
# Every setting, the address included, is a BART_OPT_* variable (a command-line flag would override -e).
CMD ["bart-opt", "serve"]
