"""gRPC rendezvous server and client backend for rallypoint."""
