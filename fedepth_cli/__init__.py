"""The ``fedepth`` command line, above the packages it drives (``fedepth``, the coordinator's
client and the gRPC benchmark transport); none of them imports it.

``fedepth = fedepth_cli.main:main`` (setup.py); ``python -m fedepth_cli`` runs the same.
"""
