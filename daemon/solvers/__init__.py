"""Allocation backends behind one interface (docs/architecture.md §4): gurobi, cbc, dp, greedy,
auto."""
