"""Generated protobuf and gRPC code of the ``offcut.v1`` protocol.

Do not edit the ``*_pb2*.py`` files: regenerate them with ``python tools/gen_protos.py``.
"""
