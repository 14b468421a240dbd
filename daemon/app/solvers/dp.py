"""Exact dynamic program for the count-level allocation problem (docs/architecture.md,
"The dp backend").

The problem is a multiple-choice knapsack: each task j picks one count n_j from its
admissible set A_j = {0} U [Jmin_j, min(Jmax_j, N)] with value f_j(n_j)
(:meth:`AllocationProblem.value_tables`, BFTrainer arXiv 2106.12091, Section 3 eq. 1-9 at count
level), subject to sum_j n_j <= N.

:func:`solve_dp` exploits that f_j is linear between consecutive *breakpoints*
B_j = {0, Jmin_j, top_j, c_j - 1, c_j, c_j + 1, floor/ceil of every curve point Ns_j}
(clipped to A_j; top_j = min(Jmax_j, N)). This holds with cost curves too
(``cost_values``: f_j uses S_j - C_j, and C_j has S_j's points); no step below assumes
f_j >= 0 or a monotone curve:

* Exchange argument: if two tasks sit strictly inside linear segments, moving one node from
  one to the other changes the objective by the difference of their slopes, so one
  direction does not worsen it; repeat until one of them reaches a breakpoint. Hence some
  optimal solution has at most ONE task off its breakpoints (the "free" task).
* Dominance: a count is never needed when a smaller admissible count has a value >= its
  value (c_j is kept on equality, it is the preferred count). The dominating count is
  always a breakpoint, so dropping dominated counts keeps the previous property. In
  particular the free task only ever sits in a segment of positive slope.
* Two DP layers over capacity k = 0..K_j (K_j = min(N, sum of the useful maxima so far)):
  L0_j(k) = best value of tasks 1..j at breakpoints with total <= k, and L1_j(k) = the
  same with exactly one free task. L0_j = max_b shift(L0_{j-1}, b) + f_j(b);
  L1_j = max(max_b shift(L1_{j-1}, b) + f_j(b), max over free n of shift(L0_{j-1}, n) +
  f_j(n)). On a free segment [a, e] with slope s the last term is
  f_j(a) + s (k - a) + max_{m in [k-e, k-a]} (L0_{j-1}(m) - s m): a sliding-window maximum,
  O(K) per segment whatever its width (van Herk / Gil-Werman; short segments are
  enumerated).
* The answer is max(L0_J(N), L1_J(N)); the argmax is recovered by a backtrack over the
  stored layers (no choice tables), which applies the tie-breaking rule directly.
* Reduced-cost fixing first (:func:`.dp_kernel._capacity_price`; Lagrangian relaxation of
  the capacity row, Kellerer, Pferschy, Pisinger, "Knapsack Problems", Springer 2004,
  Section 11.2): with the LP price lambda, the bound UB = lambda N + sum_j max_n (f_j(n) - lambda n)
  and the value LB of a feasible vector, a count n with f_j(n) - lambda n more than UB - LB
  (plus the tie tolerance) below task j's best is in no optimal vector, so it is no option;
  the layers then only span the capacities the kept options can reach (a band of tens to
  hundreds of columns near N instead of N on most of the real log's contested problems).

The rows L0_j, L1_j depend only on N and tasks 1..j: a solve keeps those its thread's
previous solve left in the scratch for the leading tasks both share (the re-allocations of
one event share most of them; :func:`.dp_kernel._common_prefix`, :func:`.dp_kernel._forward`).

The kernel lives in :mod:`.dp_kernel` (one function per phase), compiled with numba
(``njit(cache=True)``) by :func:`_get_kernel`. Without numba the original numpy DP
(:func:`_solve_dp_reference`, O(sum_j |A_j| N), kept as the tests' reference) is used.
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np

from .dp_kernel import compile_kernel
from .problem import AllocationProblem, Solution
from .ties import TIE_RTOL, best_own_count, preference_order

_CHUNK_ELEMENTS = 1 << 20  # cap on the (capacities x counts) block materialised at once
_LOOP_MAX_COUNTS = 512  # loop over counts (large pools, few counts), else blocks
_LOOP_MIN_NODES = 1024


def _solve_dp_reference(problem: AllocationProblem) -> Solution:
    """Reference exact DP (the original numpy implementation; used by the tests).

    Solve ``problem`` exactly by dynamic programming over tasks and node counts.

    V_j(m) = max over n in A_j, n <= m of V_{j-1}(m - n) + f_j(n), for capacity m = 0..N
    (V_0 = 0), vectorised over m with numpy; a choice table per task recovers the argmax.
    Cost O(sum_j |A_j| * N) time, O(J * N) memory for the choice tables.

    Shortcut (exact): when the tasks' own best counts (argmax f_j) sum to <= N, they are the
    answer without a DP.

    Ties are broken deterministically: at each task prefer keeping c_j, then fewer nodes; the
    backtrack starts from the smallest capacity that reaches the optimum.

    Returns a :class:`Solution` with ``status="optimal"`` and ``bound == objective``
    (objective re-scored by :meth:`AllocationProblem.evaluate`; counts (J,) int64 nodes).
    Raises nothing for a valid problem. Problem: BFTrainer arXiv 2106.12091, Section 3 eq. 1-9 at
    count level.
    """
    t0 = time.perf_counter()
    J, N = problem.num_tasks, problem.idle_nodes
    tables = problem.value_tables()
    orders = [
        preference_order(tables[j], int(problem.current_nodes[j]), int(problem.min_nodes[j]))
        for j in range(J)
    ]
    own = np.array([best_own_count(tables[j], orders[j]) for j in range(J)], dtype=np.int64)
    if int(own.sum()) <= N:
        counts = own
    else:
        counts = _knapsack(tables, orders, N)
    obj = problem.evaluate(counts)
    return Solution(counts=counts, objective=obj, bound=obj,
                    solve_ms=(time.perf_counter() - t0) * 1e3, solver="dp", status="optimal")


def _knapsack(tables: list[np.ndarray], orders: list[np.ndarray], N: int) -> np.ndarray:
    """The DP proper of :func:`_solve_dp_reference`; returns counts (J,) int64 [nodes].

    ``tables``: per task f_j(n), n = 0..top_j (float64, objective units); ``orders``: per task
    the admissible counts in preference order (:func:`.ties.preference_order`); ``N``: idle nodes.
    V_j(m) = max_n V_{j-1}(m - n) + f_j(n) over capacity m = 0..N, one layer per task
    (:func:`_layer_by_counts` or :func:`_layer_by_blocks`), then a backtrack over the choice
    tables from the smallest capacity reaching the optimum. Problem: BFTrainer
    arXiv 2106.12091, Section 3 eq. 1-9 at count level (a multiple-choice knapsack).
    """
    J = len(tables)
    value = np.zeros(N + 1)  # best value with total count <= m (monotone in m)
    choices: list[np.ndarray] = []
    for j in range(J):
        if len(orders[j]) <= _LOOP_MAX_COUNTS and N >= _LOOP_MIN_NODES:
            value, choice = _layer_by_counts(value, tables[j], orders[j], N)
        else:
            value, choice = _layer_by_blocks(value, tables[j], orders[j], N)
        choices.append(choice)
    best = value[N]
    m = int(np.argmax(value == best))  # smallest capacity reaching the optimum
    counts = np.zeros(J, dtype=np.int64)
    for j in range(J - 1, -1, -1):
        n = int(choices[j][m])
        counts[j] = n
        m -= n
    return counts


def _layer_by_counts(value: np.ndarray, f: np.ndarray, order: np.ndarray,
                     N: int) -> tuple[np.ndarray, np.ndarray]:
    """One knapsack layer V_j from V_{j-1} = ``value`` ((N+1,) float64, objective units over
    capacity in nodes) by one shifted maximum per admissible count (large pools, few counts).

    ``f``: f_j(n), n = 0..top_j; ``order``: admissible counts in preference order; strict '>'
    keeps the earlier (preferred) count on ties. Returns (V_j (N+1,) float64, choice (N+1,)
    int64: the count chosen at each capacity). Problem: BFTrainer arXiv 2106.12091, Section 3.
    """
    new_value = np.full(N + 1, -np.inf)
    choice = np.zeros(N + 1, dtype=np.int64)
    for n in order.tolist():
        cand = value[:N + 1 - n] + f[n]
        tail = new_value[n:]
        better = cand > tail
        tail[better] = cand[better]
        choice[n:][better] = n
    return new_value, choice


def _layer_by_blocks(value: np.ndarray, f: np.ndarray, order: np.ndarray,
                     N: int) -> tuple[np.ndarray, np.ndarray]:
    """One knapsack layer V_j from V_{j-1} = ``value`` ((N+1,) float64, objective units over
    capacity in nodes) by blocks of a (capacities x counts) candidate matrix, at most
    ``_CHUNK_ELEMENTS`` elements at once.

    ``f``: f_j(n), n = 0..top_j; ``order``: admissible counts in preference order; the first
    maximum (argmax) keeps the preferred count on ties. Returns (V_j (N+1,) float64, choice
    (N+1,) int64). Problem: BFTrainer arXiv 2106.12091, Section 3.
    """
    top = len(f) - 1
    # padded[top + m - n] == value[m - n], -inf for m < n
    padded = np.concatenate((np.full(top, -np.inf), value))
    windows = np.lib.stride_tricks.sliding_window_view(padded, top + 1)  # (N+1, top+1)
    cols = top - order  # window column holding value[m - n] for count n
    gains = f[order]
    new_value = np.empty(N + 1)
    choice = np.empty(N + 1, dtype=np.int64)
    step = max(1, _CHUNK_ELEMENTS // len(order))
    for lo in range(0, N + 1, step):
        hi = min(N + 1, lo + step)
        cand = windows[lo:hi][:, cols] + gains  # (rows, |A_j|)
        k = np.argmax(cand, axis=1)  # first maximum: preference order
        new_value[lo:hi] = cand[np.arange(hi - lo), k]
        choice[lo:hi] = order[k]
    return new_value, choice


# ---------------------------------------------------------------- breakpoint DP (compiled)
_BRUTE_WIDTH = 8  # free segments up to this many counts are enumerated (one shifted maximum
# per count), wider ones use the van Herk / Gil-Werman window (about three passes whatever the
# width): on the 6,364 problems of the whole-machine ImageNet replay, widths 6-8 were fastest
# (kernel CPU time 1.5-1.7x less than at 32, where the window was a log-time doubling)
_FIRST_PASS_SLACK = 128  # the first forward pass covers capacities N-128..N: one pass
# suffices unless the optimum leaves more than 128 nodes unused (dp_kernel._forward)
_WORK_KEEP_ELEMENTS = 1 << 24  # keep per-thread scratch up to 128 MiB between calls


_KERNEL = None
_KERNEL_ERROR: str | None = None
_WORK = threading.local()  # per thread: the kernel's scratch, kept to avoid page faults, and
# (``rows``) what the last solve left in it for the next: (scratch, dp_kernel.kernel's prev)


def _no_rows() -> tuple:
    """:func:`.dp_kernel.kernel`'s ``prev`` when no solve left rows: empty arrays, N = -1."""
    none_f, none_i = np.zeros(0), np.zeros(0, dtype=np.int64)
    one = np.zeros(1, dtype=np.int64)
    return (none_f, one, -1, none_i, none_i, np.zeros(0, dtype=np.bool_), none_i, none_i,
            none_i, none_f, one)


def _rows_left(problem: AllocationProblem, packed: tuple, answer: tuple) -> tuple:
    """:func:`.dp_kernel.kernel`'s ``prev`` for the next solve on the same scratch after it
    solved ``problem`` (``packed``: :func:`_pack`'s arrays; ``answer``: the kernel's return,
    with at least one forward pass): the value tables (a copy: callers own theirs), N, and
    the kernel's own row ends, flags and options as they are. Rows of the breakpoint DP
    (module docstring; BFTrainer arXiv 2106.12091, Section 3)."""
    tab, tab_off, _, _ = packed
    _, _, K, LO, H1, _, options = answer
    return (tab.copy(), tab_off, problem.idle_nodes, K, LO, H1, *options)


def _workspace(J: int, N: int) -> np.ndarray:
    """Scratch of shape (>= 2 J + 4, N + 1) float64 for this thread (J tasks, N idle nodes),
    grown when too small. Rows are indexed by the kernel, so more rows are fine (columns:
    contiguous rows). Holds the layers L0/L1 of the breakpoint DP (module docstring; problem:
    BFTrainer arXiv 2106.12091, Section 3), kept between calls to avoid page faults.
    """
    w = getattr(_WORK, "array", None)
    rows, cols = 2 * J + 4, N + 1
    if w is None or w.shape[0] < rows or w.shape[1] != cols:
        if w is not None and w.shape[1] == cols:
            rows = max(rows, w.shape[0])
        if rows * cols > _WORK_KEEP_ELEMENTS:
            return np.empty((rows, cols))  # too large to keep around
        w = np.empty((rows, cols))
        _WORK.array = w
    return w


def _get_kernel():
    """The compiled :func:`.dp_kernel.kernel` (numba ``njit``, on-disk cache when a cache
    folder is writable), or None when numba is unavailable (reason in ``_KERNEL_ERROR``).
    Compiled on first use, not at import. Breakpoint DP of the module docstring (problem:
    BFTrainer arXiv 2106.12091, Section 3).
    """
    global _KERNEL, _KERNEL_ERROR
    if _KERNEL is not None or _KERNEL_ERROR is not None:
        return _KERNEL
    try:
        from numba import njit
    except ImportError as exc:  # fall back to the numpy reference DP
        _KERNEL_ERROR = f"numba not importable: {exc}"
        return None
    try:
        _KERNEL = compile_kernel(njit, cache=True)
    except Exception:  # no writable cache locator (read-only install): compile per process
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _KERNEL = compile_kernel(njit, cache=False)
    return _KERNEL


def _pack(problem: AllocationProblem):
    """The kernel's flat inputs: (tab, tab_off, ns, ns_off).

    ``tab``, ``tab_off``: every task's f_j(n), n = 0..top_j, on one flat array with (J+1,)
    int64 offsets (:meth:`AllocationProblem.flat_value_tables`; float64, objective units);
    ``ns``: the curves' node counts Ns_j (float64, nodes) concatenated; ``ns_off``: (J+1,)
    int64 offsets. Problem: BFTrainer arXiv 2106.12091, Section 3 eq. 1-9 at count level.
    """
    tab, tab_off = problem.flat_value_tables()
    J = problem.num_tasks
    ns_off = np.zeros(J + 1, dtype=np.int64)
    np.cumsum([len(x) for x in problem.node_counts], out=ns_off[1:])
    ns = np.concatenate(problem.node_counts) if J else np.zeros(0)
    return tab, tab_off, ns, ns_off


def solve_dp(problem: AllocationProblem) -> Solution:
    """Solve ``problem`` exactly (breakpoint DP with at most one free task, see the module
    docstring). Cost O(sum_j (|B_j| + number of free segments) * K_j) with K_j <= N,
    memory O(J * N) for the two layers.

    Shortcut (exact): when the tasks' own best counts (argmax f_j, ties: c_j, then fewer
    nodes) sum to <= N, they are the answer without a DP.

    Ties are broken by the exact backends' one rule (:mod:`.ties`): the fewest total nodes
    among optimal solutions, then,
    from the last task backwards, each task's most preferred count (c_j, then fewer nodes)
    that keeps the optimum reachable. Values within 1e-12 of sum_j max|f_j| count as equal,
    so float rounding cannot flip a tie (the reference DP compares exactly; on exact ties
    both pick the same counts, on near-ties they may differ by that rounding).

    Returns a :class:`Solution` with ``status="optimal"`` and ``bound == objective``
    (objective re-scored by :meth:`AllocationProblem.evaluate`). Raises nothing for a valid
    problem. Without numba this is :func:`_solve_dp_reference`. Counts are (J,) int64 nodes;
    the objective is in the units of :meth:`AllocationProblem.evaluate`. Problem: BFTrainer
    arXiv 2106.12091, Section 3 eq. 1-9 at count level.
    """
    t0 = time.perf_counter()
    kernel = _get_kernel()
    if kernel is None:
        return _solve_dp_reference(problem)
    J = problem.num_tasks
    if J == 0:
        counts = np.zeros(0, dtype=np.int64)
    else:
        packed = _pack(problem)
        work = _workspace(J, problem.idle_nodes)
        left = getattr(_WORK, "rows", None)
        prev = left[1] if left is not None and left[0] is work else _no_rows()
        answer = kernel(*packed, problem.min_nodes, problem.current_nodes, problem.idle_nodes,
                        TIE_RTOL, _BRUTE_WIDTH, _FIRST_PASS_SLACK, work, prev)
        counts, passes = answer[0], answer[1]
        if passes:  # the rows in ``work`` are this problem's now
            _WORK.rows = (work, _rows_left(problem, packed, answer))
    obj = problem.evaluate(counts)
    return Solution(counts=counts, objective=obj, bound=obj,
                    solve_ms=(time.perf_counter() - t0) * 1e3, solver="dp", status="optimal")


def warm_up() -> float:
    """Compile (or load from numba's on-disk cache) the dp kernel by solving a tiny problem
    (2 tasks, 3 idle nodes; the breakpoint DP of the module docstring, BFTrainer
    arXiv 2106.12091, Section 3).

    Returns the seconds it took (about 1 s with the cache, 18-25 s on a 2-core machine without;
    10-12 s before the reduced-cost fixing).
    The daemon calls it before it reports SERVING, so no event waits for a compilation.
    """
    import time

    started = time.perf_counter()
    solve_dp(AllocationProblem(
        idle_nodes=3, current_nodes=[1, 0], min_nodes=[1, 1], max_nodes=[2, 2],
        node_counts=[[0, 1, 2], [0, 1, 2]], objective_values=[[0.0, 1.0, 1.5], [0.0, 2.0, 2.5]],
        tfwd_s=10.0, rescale_up_s=[1.0, 1.0], rescale_down_s=[1.0, 1.0]))
    return time.perf_counter() - started


def compiled_kernel_missing() -> str | None:
    """Why the compiled kernel (:mod:`.dp_kernel`, BFTrainer arXiv 2106.12091, Section 3 at count
    level) is not in use (numba missing), or None when it is."""
    _get_kernel()
    return _KERNEL_ERROR
