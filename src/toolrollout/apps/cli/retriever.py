"""``toolrollout retriever serve``: a BM25 retrieval server with Search-R1's ``/retrieve`` API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toolrollout.apps.cli._common import (
    ApiKeyOption,
    InsecureOption,
    MaxBodyMbOption,
    MaxRequestsOption,
    require_extra,
)

__all__ = ["register", "retriever_app", "serve"]

retriever_app = typer.Typer(
    name="retriever",
    help="A local BM25 retriever speaking Search-R1's /retrieve API (for the search tool).",
    no_args_is_help=True,
)


@retriever_app.command("serve")
def serve(
    corpus: Annotated[
        Path | None,
        typer.Option(
            help='JSON Lines corpus: {"id", "contents": "\\"Title\\"\\nbody"} (Search-R1) or '
            '{"id", "title", "text"} rows. Default: the bundled demo corpus.',
            dir_okay=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (Search-R1's default is 8000).")] = 8000,
    topk: Annotated[
        int, typer.Option(min=1, help="Hits per query when a request gives no topk.")
    ] = 3,
    stem: Annotated[
        bool, typer.Option("--stem/--no-stem", help="Stem English words (PyStemmer).")
    ] = True,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    api_key: ApiKeyOption = None,
    insecure: InsecureOption = False,
    max_body_mb: MaxBodyMbOption = 4.0,
    max_requests: MaxRequestsOption = 256,
) -> None:
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

    path = DEMO_CORPUS_PATH if corpus is None else corpus
    security = retriever_security(
        api_key=api_key or None,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        max_concurrent_requests=max_requests,
    )
    try:
        check_bind(host, security, insecure=insecure, server="the retriever")
        documents = load_corpus(path)
        retriever = Bm25Retriever(documents, stemming=stem)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    typer.echo(
        f"indexed {len(documents)} documents from {path} in {retriever.index_seconds:.2f}s "
        f"(stemming {'on' if retriever.stemming else 'off'}); "
        f"serving http://{host}:{port}/retrieve",
        err=True,
    )
    uvicorn.run(
        create_retriever_app(retriever, default_topk=topk, security=security),
        host=host,
        port=port,
        log_level=log_level,
    )


def register(app: typer.Typer) -> None:
    """Add the ``retriever`` command group to the ``toolrollout`` app."""
    app.add_typer(retriever_app, name="retriever")
