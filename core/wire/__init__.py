"""The one conversion between Offcut's own forms and the ``offcut.v1`` messages, each concept
in one module, used by both ends: the daemon's gRPC edge (replies to messages, requests to the
application's forms) and the client (messages to the typed views it returns)
(docs/architecture.md, "Layers")."""
