"""``toolrollout retriever serve``: a BM25 retrieval server with Search-R1's ``/retrieve`` API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from toolrollout.apps.cli._common import fail, require_extra
from toolrollout.apps.cli._options import SERVER, command, opt

__all__ = ["OPTIONS", "register", "retriever_app", "serve"]

retriever_app = typer.Typer(
    name="retriever",
    help="A local BM25 retriever speaking Search-R1's /retrieve API (for the search tool).",
    no_args_is_help=True,
)

# fmt: off
OPTIONS = [
    opt("corpus", Path | None, None, 'JSON Lines corpus: {"id", "contents": "\\"Title\\"\\nbody"} '
        '(Search-R1) or {"id", "title", "text"} rows. Default: the bundled demo corpus.',
        dir_okay=False),
    SERVER["host"],
    opt("port", int, 8000, "TCP port (Search-R1's default is 8000)."),
    opt("topk", int, 3, "Hits per query when a request gives no topk.", min=1),
    opt("stem", bool, True, "Stem English words (PyStemmer).", "--stem/--no-stem"),
    SERVER["log_level"], SERVER["api_key"], SERVER["insecure"],
    SERVER["max_body_mb"].but(default=4.0), SERVER["max_requests"].but(default=256),
]
# fmt: on


def serve(flags: Any) -> None:
    """Index a corpus with BM25 (bm25s) and serve POST /retrieve and GET /health.

    A non-loopback --host needs --api-key / TOOLROLLOUT_API_KEY unless --insecure.
    """
    require_extra("search", "toolrollout retriever serve")
    import uvicorn

    from toolrollout._exceptions import UserError
    from toolrollout._security import check_bind
    from toolrollout.search import Bm25Retriever, load_corpus
    from toolrollout.search.demo_corpus import DEMO_CORPUS_PATH
    from toolrollout.search.retriever import create_retriever_app, retriever_security

    path = DEMO_CORPUS_PATH if flags.corpus is None else flags.corpus
    security = retriever_security(
        api_key=flags.api_key or None,
        max_body_bytes=int(flags.max_body_mb * 1024 * 1024),
        max_concurrent_requests=flags.max_requests,
    )
    try:
        check_bind(flags.host, security, insecure=flags.insecure, server="the retriever")
        documents = load_corpus(path)
        retriever = Bm25Retriever(documents, stemming=flags.stem)
    except UserError as exc:
        raise fail(str(exc)) from exc
    typer.echo(
        f"indexed {len(documents)} documents from {path} in {retriever.index_seconds:.2f}s "
        f"(stemming {'on' if retriever.stemming else 'off'}); "
        f"serving http://{flags.host}:{flags.port}/retrieve",
        err=True,
    )
    uvicorn.run(
        create_retriever_app(retriever, default_topk=flags.topk, security=security),
        host=flags.host,
        port=flags.port,
        log_level=flags.log_level,
    )


def register(app: typer.Typer) -> None:
    """Add the ``retriever`` command group to the ``toolrollout`` app."""
    command(retriever_app, "serve", OPTIONS, serve)
    app.add_typer(retriever_app, name="retriever")
