"""Metrics and display: `/metric` (gpu-manager's container metrics, per-card and agent metrics), `/graph`,
`/usage`, `/healthz`, `/readyz`.

    metrics = AgentMetrics()                                  # the agent calls its event methods
    reader = UsageReader(state, backend, pods.get, CgroupReader(cgroup_root))
    server = await start_http(build_app(metrics, reader, ready=lambda: agent.ready), *parse_addr(addr))
    ...
    await server.close()
"""

from gpumgr.metrics.events import AgentMetrics
from gpumgr.metrics.http import MetricsServer, build_app, parse_addr, start_http
from gpumgr.metrics.usage import NodeSnapshot, UsageReader

__all__ = ["AgentMetrics", "MetricsServer", "NodeSnapshot", "UsageReader", "build_app", "parse_addr", "start_http"]
