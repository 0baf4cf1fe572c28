"""Errors of ``rallypoint.rpc``. Every one names the worker and, where there is one, the function."""

from __future__ import annotations

from rallypoint.core.errors import RallypointError

__all__ = ["RemoteException", "RpcError", "RpcRefused", "RpcTimeout", "SerializationError", "WorkerUnavailable"]


class RpcError(RallypointError):
    """Base class of RPC failures (not of exceptions raised by the called function itself)."""


class RpcTimeout(RpcError, TimeoutError):
    """A call did not complete within its timeout.

    Attributes:
        worker: the callee's name.
        function: the import path of the function (or ``RRef.method``) that was called.
        timeout: the timeout in seconds.
    """

    def __init__(self, worker: str, function: str, timeout: float) -> None:
        super().__init__(
            f"RPC to {worker} calling {function} timed out after {timeout:g}s; "
            "pass a longer timeout= or raise [rpc] timeout"
        )
        self.worker = worker
        self.function = function
        self.timeout = timeout


class WorkerUnavailable(RpcError, ConnectionError):
    """The callee (or an RRef's owner) cannot be reached: it exited, crashed or was never started.

    Attributes:
        worker: the worker's name.
    """

    def __init__(self, worker: str, detail: str) -> None:
        super().__init__(f"worker {worker} is unavailable: {detail}")
        self.worker = worker


class RpcRefused(RpcError, PermissionError):
    """The callee refused the call and executed nothing (not exposed, not authenticated, pickle under safe)."""


class SerializationError(RpcError, TypeError):
    """A value cannot travel under the configured serializer (or a received one is malformed)."""


class RemoteException(RpcError):
    """An exception raised remotely whose type is not available here (its module is not imported).

    Attributes:
        type_name: ``module.QualName`` of the remote exception.
        worker: where it was raised.
        remote_traceback: the traceback text on that worker.
    """

    def __init__(self, type_name: str, message: str, worker: str, remote_traceback: str) -> None:
        super().__init__(f"{type_name}: {message} (raised on {worker})")
        self.type_name = type_name
        self.worker = worker
        self.remote_traceback = remote_traceback
