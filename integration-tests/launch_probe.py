"""A worker that records what it was started with: ranks, MASTER_ADDR, Gloo's interface, host."""

import json
import os
import socket
import sys
from pathlib import Path

keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "TORCHELASTIC_RUN_ID")
record = {k: os.environ.get(k) for k in keys}
record["host"] = socket.gethostname()
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{record['RANK']}.json").write_text(json.dumps(record))
