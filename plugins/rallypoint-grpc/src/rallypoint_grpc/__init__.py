"""gRPC for rallypoint: the rendezvous server and client backend, and the RPC transport.

The RPC transport is the wing :mod:`rallypoint_grpc.rpc`; the rendezvous modules sit at the top
(for now), beside the channel code both use (:mod:`rallypoint_grpc.transport`).

Importing any module of this package first turns gRPC's fork support off for the process
(``GRPC_ENABLE_FORK_SUPPORT=0``, unless the environment already sets it), before :mod:`grpc` is
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
