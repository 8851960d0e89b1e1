"""fedepth on Flower (``pip install`` the ``flower`` extra): the strategies as Flower strategies.

:class:`~fedepth_flower.strategy.FedepthStrategy` wraps any fedepth strategy for Flower's
Message API; :mod:`~fedepth_flower.client_app` and :mod:`~fedepth_flower.server_app` are the
ClientApp and ServerApp of ``examples/flower`` (the benchmark run with ``flwr run``);
:mod:`~fedepth_flower.records` is what travels in the messages; :mod:`~fedepth_flower.runner`
plugs the Flower runtime into :func:`fedepth.bench.run_benchmark`. This package imports
``fedepth`` and ``flwr``; ``fedepth`` itself never imports either this package or ``flwr``.
"""

from fedepth_flower.strategy import FedepthStrategy, FlowerBridgeError

__all__ = ["FedepthStrategy", "FlowerBridgeError"]
