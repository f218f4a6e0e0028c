"""The applications built on the library, each behind an extra.

Everything under ``toolrollout.apps`` is a program rather than something a trainer imports:
the embedded engine's server (``server``), the OpenAI/Anthropic-compatible recording proxy
(``gateway``), the command line (``cli``), evaluation (``eval``), the throughput benchmark
(``bench``), the Ray driver (``distributed``), the demo models and their training scripts
(``demo``, ``demo_vl``) and the MCP servers toolrollout ships (``mcp_servers``). They import
the library; the library never imports them (``tests/test_import_graph.py``).
"""
