"""The ``toolrollout`` command line.

Each command lives in its own module of this package (``serve.py``, ...) and exposes a
``register(app)`` function; this module only assembles them. Commands import their heavy
dependencies (torch, transformers, uvicorn) inside their bodies so ``--help`` stays fast.
"""

from __future__ import annotations

import typer

from toolrollout.apps.cli import bench as _bench
from toolrollout.apps.cli import eval as _eval
from toolrollout.apps.cli import gateway as _gateway
from toolrollout.apps.cli import generate as _generate
from toolrollout.apps.cli import retriever as _retriever
from toolrollout.apps.cli import sandbox as _sandbox
from toolrollout.apps.cli import serve as _serve
from toolrollout.apps.cli import tools as _tools

__all__ = ["app", "main"]

app = typer.Typer(
    name="toolrollout",
    help="Async multi-turn tool-calling rollouts for LLM RL against SGLang.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Async multi-turn tool-calling rollouts for LLM RL against SGLang."""


for _command in (_serve, _generate, _eval, _gateway, _retriever, _tools, _sandbox, _bench):
    _command.register(app)


def main() -> None:
    """Entry point of the ``toolrollout`` console script.

    A command checks its extra before it starts; should one still reach an optional module
    that is not installed, the error is one line naming the extra, not a traceback.
    """
    from toolrollout._exceptions import MissingExtraError
    from toolrollout._extras import extra_for_module

    try:
        app()
    except MissingExtraError as exc:  # an application entry point said which extra
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    except ModuleNotFoundError as exc:
        extra = extra_for_module(exc.name or "")
        if extra is None:
            raise
        typer.echo(
            f"error: {exc.name} is not installed: pip install 'toolrollout[{extra}]'", err=True
        )
        raise SystemExit(2) from None
