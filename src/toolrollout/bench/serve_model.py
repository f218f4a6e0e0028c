"""``python -m toolrollout.bench.serve_model``: run the latency-model server (see ``--help``)."""

from toolrollout.bench._server import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
