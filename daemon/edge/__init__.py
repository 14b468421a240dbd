"""The daemon's gRPC edge: the server, its servicers, the wire protocol (protobuf <-> the
application's events and replies), callers' identities and roles, request bounds, streams,
metrics and health (docs/architecture.md, "Modules"). It calls into :mod:`offcut.daemon.app`;
nothing in the application imports it."""
