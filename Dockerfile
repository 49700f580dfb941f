# bart-opt HTTP service on a CUDA PyTorch runtime.
#   docker build -t bart-opt .
#   docker run --gpus all -p 8000:8000 -v bart-opt-hf:/cache/huggingface bart-opt
# Evaluation jobs: their SQLite database is on the /var/lib/bart-opt volume; files for
# POST /evaluate {"dataset": {"file": ...}} are read from /data (-v "$PWD/data:/data:ro").
# Settings are BART_OPT_* environment variables (docker run -e BART_OPT_API_KEY=...).
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/cache/huggingface \
    BART_OPT_DB=/var/lib/bart-opt/jobs.db \
    BART_OPT_DATA_DIR=/data

WORKDIR /opt/bart-opt
COPY pyproject.toml README.md ./
COPY bart_opt ./bart_opt
COPY app ./app
# g++ builds the fast mode's CPU attention kernel on first use (bart_opt/csrc; without it the fast mode
# falls back to torch's kernel). torch comes with the base image (it satisfies pyproject's torch
# requirement); pip adds the rest.
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/* \
 && pip install . \
 && useradd --create-home --uid 10001 bartopt \
 && mkdir -p /cache/huggingface /var/lib/bart-opt /data \
 && chown bartopt /cache/huggingface /var/lib/bart-opt

USER bartopt
# Model downloads (facebook/bart-large-cnn on first start) land here; keep it on a volume.
VOLUME ["/cache/huggingface", "/var/lib/bart-opt"]
EXPOSE 8000

# /health answers while the model loads; the start period covers a first download.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"

# SIGTERM (docker stop) drains the requests in flight and exits 0; give it time: docker stop -t 60.
STOPSIGNAL SIGTERM
CMD ["bart-opt", "serve", "--host", "0.0.0.0", "--port", "8000"]
