"""The device side of the service: the one model (`engine`), the thread that owns the device (`worker`) and what
that thread does with one micro-batch (`runner`). Shared by ``POST /summarize`` and the evaluation jobs."""
