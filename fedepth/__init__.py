"""fedepth: federated monocular depth estimation for heterogeneous robot fleets (FeDepth).

The core library knows nothing of ROS or gRPC: it holds the descriptor, the soft clustering,
the models, the training loop, the federated strategies, the data readers and the benchmark.
"""

__version__ = "0.1.0"
