"""One mode in a fresh process, so its CPU time and peak memory are its own.

``python -m toolrollout.apps.bench._worker '<DriverSpec as JSON>'`` runs a latency-model
driver, ``... _worker MODE '<RealBenchConfig as JSON>'`` a real-server mode; either prints
one JSON line: the mode's counts, ``makespan_s`` and ``client_cpu_s`` (wall and CPU time of
the measured run only, every thread included; the driver takes them) and ``peak_rss_mb``
(the process's high-water mark, imports included).
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "run_measured"]


def run_measured(spec_json: str) -> dict[str, Any]:
    import anyio

    from ._drivers import run_driver
    from ._model import DriverSpec

    raw = json.loads(spec_json)
    raw["engine_urls"] = tuple(raw["engine_urls"])
    raw["policies"] = tuple(raw.get("policies") or ())
    spec = DriverSpec(**raw)
    result = anyio.run(run_driver, spec)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result["mode"] = spec.mode
    return result


def main(argv: Sequence[str] | None = None) -> None:
    from ._real import REAL_MODES, RealBenchConfig, run_real_mode

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 1:
        result = run_measured(args[0])
    elif len(args) == 2 and args[0] in REAL_MODES:
        result = run_real_mode(args[0], RealBenchConfig(**json.loads(args[1])))
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    else:
        raise SystemExit(
            "usage: python -m toolrollout.apps.bench._worker '<spec json>' | MODE '<config json>'"
        )
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
