"""The bart-opt HTTP service (FastAPI): ``app.main.create_app``, ``app.server.serve``."""
