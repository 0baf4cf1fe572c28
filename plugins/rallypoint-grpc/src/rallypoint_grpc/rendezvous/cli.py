"""``rallypoint rdzv serve``: a standalone gRPC rendezvous server in the foreground.

grpc is imported only when the command runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import click

__all__ = ["rdzv"]


@click.group()
def rdzv() -> None:
    """The gRPC rendezvous server (rallypoint-grpc)."""


@rdzv.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 or :: for every one).")
@click.option("--port", default=29400, show_default=True, type=click.IntRange(0, 65535), help="Port; 0 picks one.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="File whose first line is the shared token.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="Server certificate (PEM); needs --tls-key.")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="Private key of --tls-cert (PEM).")
@click.option("--tls-client-ca", type=click.Path(dir_okay=False), help="Require client certificates of this CA (mTLS).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Persist the state here (survives a restart).")
@click.option("--max-message-bytes", default=4 << 20, show_default=True, type=click.IntRange(4096, 1 << 30))
def serve(
    host: str,
    port: int,
    token_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    data_dir: str | None,
    max_message_bytes: int,
) -> None:
    """Serve rendezvous for any number of jobs (each run id is its own space) until stopped.

    Prints "rallypoint rdzv serving on HOST:PORT" once bound (the chosen port with --port 0).
    Agents connect with [rendezvous] backend = "grpc" and [rendezvous.options] endpoint =
    "HOST:PORT", serve = "never".
    """
    from rallypoint.core.errors import RallypointError
    from rallypoint_grpc.endpoints import format_endpoint
    from rallypoint_grpc.rendezvous.server import ServerConfig, serve_forever
    from rallypoint_grpc.transport import TlsFiles, read_token

    if (tls_cert is None) != (tls_key is None) or (tls_client_ca is not None and tls_cert is None):
        raise click.UsageError("--tls-cert and --tls-key go together, and --tls-client-ca needs both")
    try:
        token = read_token(token_file)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    tls = TlsFiles(cert=tls_cert, key=tls_key, ca=tls_client_ca) if tls_cert else None
    config = ServerConfig(host, port, token=token, tls=tls, data_dir=data_dir, max_message_bytes=max_message_bytes)

    def ready(bound: int) -> None:
        security = ", ".join(
            [*(["token"] if token else []), *(["mutual TLS" if tls_client_ca else "TLS"] if tls else [])]
        )
        print(
            f"rallypoint rdzv serving on {format_endpoint(host, bound)} ({security or 'no token, no TLS'})", flush=True
        )

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: task.cancel() if task else None)
        with contextlib.suppress(asyncio.CancelledError):
            await serve_forever(config, ready)

    try:
        asyncio.run(main())
    except (OSError, ValueError) as exc:
        raise RallypointError(f"rallypoint rdzv serve: {exc}") from None
    sys.exit(0)
