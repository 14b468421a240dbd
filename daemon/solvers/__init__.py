"""Allocation backends behind one interface (DESIGN §4): gurobi, cbc, dp, greedy, auto."""
