"""Rollout throughput benchmark: a latency-model server, a tool service, drivers, report.

``toolrollout bench`` (or :func:`run_benchmark`) runs toolrollout, a lock-step baseline,
a published peer library and bare httpx POSTs against the same simulated SGLang server and
the same real tool service, one after the other in one run, and reports throughput,
orchestration efficiency, client CPU per turn and peak memory side by side. See
``docs/benchmarks.md``.
"""

from __future__ import annotations

from toolrollout._exceptions import BenchmarkError as BenchmarkError

from ._harness import MODES as MODES
from ._harness import BenchConfig as BenchConfig
from ._harness import BenchReport as BenchReport
from ._harness import default_modes as default_modes
from ._harness import run_benchmark as run_benchmark
from ._harness import serve_benchmark_services as serve_benchmark_services
from ._harness import write_json as write_json
from ._metrics import ModeResult as ModeResult
from ._metrics import critical_paths as critical_paths
from ._metrics import fifo_makespan as fifo_makespan
from ._metrics import ideal_makespan as ideal_makespan
from ._metrics import kv_bound_makespan as kv_bound_makespan
from ._metrics import orchestration_efficiency as orchestration_efficiency
from ._micro import tokenization_cost as tokenization_cost
from ._model import LatencyModel as LatencyModel
from ._model import ServerScheduling as ServerScheduling
from ._model import ToolLatency as ToolLatency
from ._model import Workload as Workload
from ._model import WorkloadGroup as WorkloadGroup
from ._model import WorkloadItem as WorkloadItem
from ._model import parse_directive as parse_directive
from ._model import parse_group_directive as parse_group_directive
from ._report import plot_report as plot_report
from ._report import render_table as render_table
from ._server import LatencyServer as LatencyServer
from ._server import create_latency_app as create_latency_app
from ._tools import LookupClient as LookupClient
from ._tools import create_tool_app as create_tool_app

__all__ = [
    "MODES",
    "BenchConfig",
    "BenchReport",
    "BenchmarkError",
    "LatencyModel",
    "LatencyServer",
    "LookupClient",
    "ModeResult",
    "ServerScheduling",
    "ToolLatency",
    "Workload",
    "WorkloadGroup",
    "WorkloadItem",
    "create_latency_app",
    "create_tool_app",
    "critical_paths",
    "default_modes",
    "fifo_makespan",
    "ideal_makespan",
    "kv_bound_makespan",
    "orchestration_efficiency",
    "parse_directive",
    "parse_group_directive",
    "plot_report",
    "render_table",
    "run_benchmark",
    "serve_benchmark_services",
    "tokenization_cost",
    "write_json",
]
