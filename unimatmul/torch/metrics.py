"""Prometheus metrics of routed products (the optional extra ``metrics``: prometheus-client).

>>> import prometheus_client
>>> import unimatmul.torch.metrics
>>> unimatmul.torch.metrics.register()     # into prometheus_client's default registry
>>> prometheus_client.start_http_server(9100)

The numbers are read from :func:`unimatmul.torch.routing.totals` when Prometheus scrapes
(a custom collector), not counted per call: the native kernels count their calls in C++
where no Python counter could, and serving pays nothing for the metrics. They never go
down (``unimatmul.torch.reset_stats()`` does not touch them):

- ``unimatmul_routed_calls_total{op, source, kind}``: calls of the routed kernels, by op
  (mm, addmm, bmm, baddbmm), by where the choice came from (``cache``, ``tuned``,
  ``bucket``, ``default``, ``confirmed``, ``reverted``, ``fallback``; ``passthrough`` for
  operands unimatmul does not take) and by what ran (``kernel``, ``default``,
  ``passthrough``);
- ``unimatmul_kernel_time_saved_seconds_total``: device (or CPU) time the confirmed
  choices saved over PyTorch's kernel, estimated from their confirmation windows'
  in-situ medians (calls x (Default - choice));
- ``unimatmul_confirmations_total{verdict}``: windows judged (``confirmed``,
  ``reverted``, ``unjudged``), and ``unimatmul_confirmation_windows_open``;
- ``unimatmul_tuning_seconds_total``: time this process spent tuning.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from unimatmul.torch import routing


class RoutingCollector:
    """A prometheus-client collector over the routing counts (read at each scrape)."""

    def describe(self) -> list[Any]:
        return []  # a custom collector: its families are known at collect time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        totals = routing.totals()
        calls = CounterMetricFamily(
            "unimatmul_routed_calls",
            "Calls of the routed matrix-product kernels, by op, choice source and what ran",
            labels=["op", "source", "kind"],
        )
        for op, source, kind, count in totals["calls"]:
            calls.add_metric([op, source, kind], count)
        yield calls
        confirm = totals["confirm"]
        yield CounterMetricFamily(
            "unimatmul_kernel_time_saved_seconds",
            "Kernel time the confirmed choices saved over PyTorch's kernel (in-situ medians)",
            value=confirm["saved_s"],
        )
        verdicts = CounterMetricFamily(
            "unimatmul_confirmations", "Confirmation windows judged, by verdict", labels=["verdict"]
        )
        for verdict in ("confirmed", "reverted", "unjudged"):
            verdicts.add_metric([verdict], confirm[verdict])
        yield verdicts
        yield GaugeMetricFamily(
            "unimatmul_confirmation_windows_open",
            "Choices still in their confirmation window",
            value=confirm["open"],
        )
        yield CounterMetricFamily(
            "unimatmul_tuning_seconds", "Seconds this process spent tuning", value=totals["tuning_s"]
        )


def register(registry: Any = None) -> RoutingCollector:
    """Register the collector (into prometheus_client's default registry unless given one)."""
    try:
        from prometheus_client import REGISTRY
    except ImportError as exc:
        msg = "unimatmul.torch.metrics needs prometheus-client: pip install -e '.[metrics]' in the unimatmul checkout"
        raise ImportError(msg) from exc
    collector = RoutingCollector()
    (registry if registry is not None else REGISTRY).register(collector)
    return collector
