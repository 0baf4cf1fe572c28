"""etcd v3 rendezvous backend for rallypoint (leases, watches, transactions)."""
