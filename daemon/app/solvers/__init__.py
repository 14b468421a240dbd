"""Allocation backends behind one interface (docs/architecture.md, "Solver backends"): gurobi, cbc,
dp, greedy, auto."""
