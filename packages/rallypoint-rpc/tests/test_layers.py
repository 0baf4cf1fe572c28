"""The RPC modules stand on each other one way (#37): the low ones load and work without the high ones.

The agent and the serializer learn of RRefs and distributed autograd from those modules (they
register themselves, or the agent loads autograd when a message needs it), never by importing
them up front; these tests run in a fresh interpreter so that nothing this process loaded hides
an import.
"""

from __future__ import annotations

import json
import subprocess
import sys


def _fresh(code: str) -> object:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_agent_loads_without_the_api_rrefs_autograd_or_torch() -> None:
    loaded = _fresh(
        "import json, sys\n"
        "import rallypoint.rpc.agent\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('rallypoint.rpc', 'torch')))))\n"
    )
    assert isinstance(loaded, list)
    assert "rallypoint.rpc.agent" in loaded
    assert not {"rallypoint.rpc.api", "rallypoint.rpc.rref", "rallypoint.rpc.autograd", "torch"} & set(loaded)


def test_importing_the_rref_module_makes_rrefs_travel_as_references() -> None:
    registered = _fresh(
        "import json\n"
        "from rallypoint.rpc import serialization\n"
        "before = serialization._REFERENCES['type']\n"
        "import rallypoint.rpc.rref\n"
        "after = serialization._REFERENCES['type']\n"
        "print(json.dumps([before is rallypoint.rpc.rref.RRef, after is rallypoint.rpc.rref.RRef]))\n"
    )
    assert registered == [False, True]


def test_without_the_rref_module_the_error_names_the_worker_and_the_module() -> None:
    message = _fresh(
        "import json\n"
        "from types import SimpleNamespace\n"
        "from rallypoint.rpc.errors import SerializationError\n"
        "from rallypoint.rpc.serialization import attach_reference\n"
        "try:\n"
        "    attach_reference(SimpleNamespace(info=SimpleNamespace(name='trainer0')), '1.0', None)\n"
        "except SerializationError as exc:\n"
        "    print(json.dumps(str(exc)))\n"
    )
    assert message == "trainer0 received an RRef but this process never imported rallypoint.rpc.rref"
