"""The rendezvous wing of the gRPC plugin: the ``grpc`` backend of :mod:`rallypoint.rendezvous`.

* :mod:`~rallypoint_grpc.rendezvous.options`: ``[rendezvous.options]`` (endpoint, hosting, token,
  TLS, deadlines); no grpc import.
* :mod:`~rallypoint_grpc.rendezvous.backend`: the client every agent uses, and
  :mod:`~rallypoint_grpc.rendezvous.session`, its one long-lived stream to the server.
* :mod:`~rallypoint_grpc.rendezvous.tls_check`: why a connection failed at TLS, in words.
* :mod:`~rallypoint_grpc.rendezvous.hosting`: the agent that owns the endpoint's address serves it.
* :mod:`~rallypoint_grpc.rendezvous.server`: the ``grpc.aio`` service, with
  :mod:`~rallypoint_grpc.rendezvous.session_server` (one client's stream) over
  :mod:`~rallypoint_grpc.rendezvous.store` (the key-value state, leases and waiters), with its
  bounds and request checks in :mod:`~rallypoint_grpc.rendezvous.limits` and its persistence in
  :mod:`~rallypoint_grpc.rendezvous.store_log`.
* :mod:`~rallypoint_grpc.rendezvous.cli`: ``rallypoint rdzv serve``, a standalone server.
* :mod:`~rallypoint_grpc.rendezvous.torch_handler`: ``torchrun --rdzv-backend rallypoint-grpc``.

The wing stands on the plugin's shared code (:mod:`rallypoint_grpc.transport`: the channel per
process, TLS files, tokens; :mod:`rallypoint_grpc.endpoints`: ``HOST:PORT``;
:mod:`rallypoint_grpc.security`: the token and TLS options and their file checks) and never on
the RPC wing beside it (:mod:`rallypoint_grpc.rpc`), nor it on this one
(``integration-tests/test_import_graph.py`` holds both). Importing it loads nothing heavy.
"""
