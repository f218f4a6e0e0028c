"""Rollout throughput benchmark: a latency-model server, a tool service, drivers, report.

``toolrollout bench`` (or :func:`run_benchmark`) runs toolrollout, a lock-step baseline,
a published peer library and bare httpx POSTs against the same simulated SGLang server and
the same real tool service, one after the other in one run, and reports throughput,
orchestration efficiency, client CPU per turn and peak memory side by side. See
``docs/benchmarks.md``.
"""

from __future__ import annotations

from ._harness import MODES as MODES
from ._harness import BenchConfig as BenchConfig
from ._harness import default_modes as default_modes
from ._harness import run_benchmark as run_benchmark
from ._harness import serve_benchmark_services as serve_benchmark_services
from ._harness import write_json as write_json
from ._micro import tokenization_cost as tokenization_cost
from ._model import LatencyModel as LatencyModel
from ._model import ServerScheduling as ServerScheduling
from ._model import ToolLatency as ToolLatency
from ._model import Workload as Workload
from ._model import WorkloadItem as WorkloadItem
from ._report import plot_report as plot_report
from ._report import render_table as render_table
from ._tools import LookupClient as LookupClient

__all__ = [
    "MODES",
    "BenchConfig",
    "LatencyModel",
    "LookupClient",
    "ServerScheduling",
    "ToolLatency",
    "Workload",
    "WorkloadItem",
    "default_modes",
    "plot_report",
    "render_table",
    "run_benchmark",
    "serve_benchmark_services",
    "tokenization_cost",
    "write_json",
]
