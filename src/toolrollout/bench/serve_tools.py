"""``python -m toolrollout.bench.serve_tools``: run the benchmark's tool service (``--help``)."""

from toolrollout.bench._tools import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
