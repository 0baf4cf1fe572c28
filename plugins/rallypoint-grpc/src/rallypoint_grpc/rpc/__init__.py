"""The RPC wing of the gRPC plugin: the ``grpc`` transport of :mod:`rallypoint.rpc`.

* :mod:`~rallypoint_grpc.rpc.options`: ``[rpc.options]`` (token, TLS files); no grpc import.
* :mod:`~rallypoint_grpc.rpc.transport`: the transport itself (gRPC calls, the token interceptor,
  the hand-over to the fast paths below).
* :mod:`~rallypoint_grpc.rpc.socket_server` and :mod:`~rallypoint_grpc.rpc.socket_client`: the
  persistent socket per pair of workers that calls take after the first gRPC one (its message
  format lives with the server).
* :mod:`~rallypoint_grpc.rpc.shared_memory`: large frames between workers of one host.

The wing stands on the plugin's shared code (:mod:`rallypoint_grpc.transport`: the channel per
process, TLS files, tokens; :mod:`rallypoint_grpc.endpoints`: ``HOST:PORT``;
:mod:`rallypoint_grpc.security`: the token and TLS options and their file checks) and never on
the rendezvous wing beside it (:mod:`rallypoint_grpc.rendezvous`), nor it on this one
(``integration-tests/test_import_graph.py`` holds both). Importing it loads nothing heavy.
"""
