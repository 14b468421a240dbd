"""The daemon's application: the deterministic engine (state, event) -> (state', outcome),
the scheduler and its collaborators, policies, solvers, learned models and the engine's
store (journal, snapshots, archive); no gRPC, no protobuf (docs/architecture.md, "Modules")."""
