"""The engine servers of a ``--ray`` run, which every actor talks to.

Without ``engine_urls`` the driver starts one shared ``toolrollout serve`` on its own node
for the whole run (never one engine per actor: a model copy per actor would multiply memory
and split the batching). That server requires a random API key made for the run
(``secrets.token_urlsafe``), handed to the server in its environment (never on its command
line) and to the workers in their :class:`~toolrollout.spec.RunSpec`: on a cluster it
listens on every interface, and only the run's own workers can use it.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import anyio
import httpx
from anyio.from_thread import start_blocking_portal

from toolrollout._exceptions import DistributedError
from toolrollout._security import ADMIN_API_KEY_ENV, API_KEY_ENV
from toolrollout._supervisor import RestartPolicy, ServiceCommand, SupervisedService, supervise
from toolrollout.engines._factory import EngineKind
from toolrollout.spec import RunSpec

__all__ = ["RunEngines", "run_engines"]


class RunEngines:
    """The engine URLs of a run; :meth:`ready` waits until they answer (a server the
    driver started, or the given ones: a wrong ``--engine-url`` is then one clear error,
    as without ``--ray``, instead of a failed row per sample)."""

    def __init__(
        self,
        urls: list[str],
        timeout: float,
        served: _ServedEngine | None = None,
        api_key: str | None = None,
        engine: EngineKind = "auto",
    ):
        self.urls, self._timeout, self._served = urls, timeout, served
        self.api_key, self.engine = api_key, engine

    def ready(self) -> list[str]:
        if self._served is not None:
            self._served.wait_started()
        else:
            import anyio

            from toolrollout.engines._factory import connect

            async def check() -> None:  # healthy, and of one kind (SGLang or vLLM)
                async with await connect(
                    self.urls, health_timeout=self._timeout, engine=self.engine,
                    api_key=self.api_key,
                ):  # fmt: skip
                    pass

            anyio.run(check)
        return self.urls


class _ServedEngine:
    """The shared ``toolrollout serve``, supervised (:func:`~toolrollout._supervisor.supervise`)
    on an event loop in a thread of its own, since the driver is synchronous: restarted
    when it dies or stops answering ``/health``, within the default
    :class:`~toolrollout._supervisor.RestartPolicy`, with the supervisor's log lines.

    It starts loading its model on entry; :meth:`wait_started` waits for its first start.
    """

    def __init__(self, command: ServiceCommand, policy: RestartPolicy | None = None) -> None:
        self._command, self._policy = command, policy
        self._started = threading.Event()
        self.service: SupervisedService | None = None

    def __enter__(self) -> Self:
        self._portal_context = start_blocking_portal()
        self._portal = self._portal_context.__enter__()
        try:
            self._stop: anyio.Event = self._portal.call(anyio.Event)
            self._held = self._portal.start_task_soon(self._hold)
        except BaseException:
            self._portal_context.__exit__(None, None, None)
            raise
        return self

    async def _hold(self) -> None:
        async with supervise(self._command, self._policy) as service:
            self.service = service
            self._started.set()
            await self._stop.wait()

    def wait_started(self) -> None:
        """Return once it has started; raise its start-up error when it could not."""
        while not self._started.wait(0.1):
            if self._held.done():
                self._held.result()  # raises the start-up error
                raise DistributedError("the shared `toolrollout serve` for --ray stopped")

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._started.is_set():
                self._portal.call(self._stop.set)
            else:  # still starting (the run failed first): stop it without waiting for it
                self._held.cancel()
        finally:
            self._portal_context.__exit__(None, None, None)  # the task has finished


@contextmanager
def run_engines(ray: Any, spec: RunSpec, address: str | None) -> Iterator[RunEngines]:
    """The servers every actor uses: the given URLs, or one shared ``toolrollout serve``
    started here (one model copy for the whole cluster, never one per actor); ``address``:
    the Ray cluster joined (None: a local one)."""
    if spec.engine_urls:
        yield RunEngines(
            list(spec.engine_urls), spec.health_timeout, api_key=spec.engine_api_key,
            engine=spec.engine,
        )  # fmt: skip
        return
    from toolrollout.sandbox._background import free_port

    # A local cluster reaches it on loopback; a real cluster at this node's address. The
    # driver itself always checks it on loopback.
    if address:  # joining a cluster
        bind, advertise = "0.0.0.0", str(ray.util.get_node_ip_address())
    else:
        bind = advertise = "127.0.0.1"
    port = free_port("127.0.0.1")

    command = [
        sys.executable,
        "-m",
        "toolrollout",
        "serve",
        "--model",
        str(spec.model_path),
        "--host",
        bind,
        "--port",
        str(port),
        "--threads",
        str(spec.threads),
        "--log-level",
        "warning",
    ]
    # One key for this run's server: in its environment, not its argv (the process list).
    key = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if k != ADMIN_API_KEY_ENV}
    env[API_KEY_ENV] = key  # the workers abort requests too: no separate admin key
    url = f"http://{advertise}:{port}"
    local = f"http://127.0.0.1:{port}"

    async def healthy(client: httpx.AsyncClient) -> bool:
        return (await client.get(f"{local}/health")).status_code == 200

    def startup_error(status: int | None, output: str) -> Exception:
        if status is None:
            return DistributedError(
                f"the shared `toolrollout serve` for --ray was not healthy at {url} "
                f"after {spec.health_timeout:.0f} s"
            )
        tail = output.strip().splitlines()[-1:]
        return DistributedError(
            f"the shared `toolrollout serve` for --ray exited with {status}: {' '.join(tail)}"
        )

    # Supervised: behind the parent-death launcher (a SIGKILL of the driver takes it along),
    # restarted when it dies or hangs, stopped (with its process group) when the run ends.
    service = ServiceCommand(
        kind="engine server",
        argv=tuple(command),
        host="127.0.0.1",
        port=port,
        ready=healthy,
        env=env,
        startup_timeout=spec.health_timeout,
        startup_error=startup_error,
    )
    with _ServedEngine(service) as served:
        yield RunEngines([url], spec.health_timeout, served, api_key=key)
