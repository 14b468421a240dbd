"""The Offcut daemon (offcutd): gRPC service, deterministic cluster core, allocation, store."""
