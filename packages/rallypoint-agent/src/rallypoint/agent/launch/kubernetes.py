"""The ``kubernetes`` launch environment: a pod of an Indexed Job (or of a JobSet's replicated job).

Kubernetes gives an Indexed Job's pod its index (``JOB_COMPLETION_INDEX``) and its host name
(``<job name>-<index>``, in ``HOSTNAME``); with a headless service named in the pod's
``subdomain``, pod ``<job name>-0`` is reachable at ``<job name>-0.<service>``. What the pod
cannot see by itself, the manifest passes with the downward API or plain values:
``RALLYPOINT_K8S_SERVICE`` (the headless service) and ``RALLYPOINT_K8S_NNODES`` (the Job's
``completions``, or ``parallelism``). A JobSet's pods also carry ``JOBSET_NAME``: the run id is
then the JobSet's name, and the endpoint host ``<jobset>-<replicated job>-0-0.<service>``.
"""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.agent.launch.facts import LaunchFacts

__all__ = ["detect"]


def detect(environ: Mapping[str, str]) -> LaunchFacts | None:
    """The job's shape from an Indexed Job pod's variables; ``None`` outside one.

    Needs ``JOB_COMPLETION_INDEX``, ``HOSTNAME`` ending in ``-<index>``, ``RALLYPOINT_K8S_NNODES``
    and ``RALLYPOINT_K8S_SERVICE``; without any one of them this is not taken for a pod of a
    multi-node job (``None``).
    """
    index_text = environ.get("JOB_COMPLETION_INDEX", "").strip()
    hostname = environ.get("HOSTNAME", "").strip()
    nnodes_text = environ.get("RALLYPOINT_K8S_NNODES", "").strip()
    service = environ.get("RALLYPOINT_K8S_SERVICE", "").strip()
    if not (index_text.isdigit() and nnodes_text.isdigit() and service and hostname.endswith(f"-{index_text}")):
        return None
    index, nnodes = int(index_text), int(nnodes_text)
    stem = hostname[: -len(f"-{index_text}")]
    jobset = environ.get("JOBSET_NAME", "").strip()
    endpoint_from = ("HOSTNAME", "RALLYPOINT_K8S_SERVICE")
    origins = {
        "nnodes": ("RALLYPOINT_K8S_NNODES",),
        "endpoint_host": endpoint_from,
        "run_id": ("JOBSET_NAME",) if jobset else ("HOSTNAME",),
        "node_id": ("HOSTNAME",),
        "node_rank": ("JOB_COMPLETION_INDEX",),
    }
    used = ["JOB_COMPLETION_INDEX", "HOSTNAME", "RALLYPOINT_K8S_NNODES", "RALLYPOINT_K8S_SERVICE"]
    if jobset:
        used.append("JOBSET_NAME")
    return LaunchFacts(
        environment="kubernetes",
        nnodes=nnodes,
        endpoint_host=f"{stem}-0.{service}",
        run_id=f"k8s-{jobset or stem}",
        node_id=hostname,
        node_rank=index,
        # the kubelet sends SIGTERM, then SIGKILL after terminationGracePeriodSeconds
        preemption_signals=("SIGTERM",),
        variables=tuple(used),
        origins=origins,
    )
