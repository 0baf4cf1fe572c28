"""gRPC for rallypoint: the rendezvous server and client backend, and the RPC transport.

Two wings over shared code: the rendezvous backend is :mod:`rallypoint_grpc.rendezvous`, the
RPC transport :mod:`rallypoint_grpc.rpc`; both stand on the modules at the top (the channel
code :mod:`rallypoint_grpc.transport`, :mod:`rallypoint_grpc.endpoints`,
:mod:`rallypoint_grpc.security`), and neither imports the other. :mod:`rallypoint_grpc.hooks`
registers both.

Importing any module of this package first turns gRPC's fork support off for the process
(``GRPC_ENABLE_FORK_SUPPORT=0``, unless the environment already sets it), before ``grpc`` is
imported. The agent starts workers with ``fork`` and ``exec`` (its ``preexec_fn`` sets the
parent-death signal), and the agent may host the rendezvous server and hold watch streams while
it does. With fork support on, gRPC's fork handlers restart its event-engine threads in the
child between ``fork`` and ``exec``; when one of them polls a descriptor the child has already
closed, gRPC aborts the child, and the worker dies with ``SIGABRT`` before its first line (seen
for about 4 in 100 worker starts on a loaded machine). A child that execs never needs gRPC's
fork handlers; one that keeps using gRPC after a plain ``fork`` is not supported by rallypoint.
"""

import os as _os

_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
