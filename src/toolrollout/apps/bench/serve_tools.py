"""``python -m toolrollout.apps.bench.serve_tools``: the benchmark's tool service."""

from toolrollout.apps.bench._tools import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
