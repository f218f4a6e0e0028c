"""``python -m toolrollout.apps.bench.serve_model``: the latency-model server (``--help``)."""

from toolrollout.apps.bench._server import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
