"""Exact dynamic program for the count-level allocation problem (docs/architecture.md §4).

The problem is a multiple-choice knapsack: each task j picks one count n_j from its
admissible set A_j = {0} U [Jmin_j, min(Jmax_j, N)] with value f_j(n_j)
(:meth:`AllocationProblem.value_tables`, BFTrainer arXiv 2106.12091 §3 eq. 1-9 at count
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
  O(K log w) per segment with branch-free doubling (short segments are enumerated).
* The answer is max(L0_J(N), L1_J(N)); the argmax is recovered by a backtrack over the
  stored layers (no choice tables), which applies the tie-breaking rule directly.

The compiled kernel uses numba (``@njit(cache=True)``). Without numba the original numpy DP
(:func:`_solve_dp_reference`, O(sum_j |A_j| N), kept as the tests' reference) is used.
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np

from .problem import AllocationProblem, Solution

_CHUNK_ELEMENTS = 1 << 20  # cap on the (capacities x counts) block materialised at once
_LOOP_MAX_COUNTS = 512  # loop over counts (large pools, few counts), else blocks
_LOOP_MIN_NODES = 1024


def _preference_order(table: np.ndarray, current: int, min_nodes: int) -> np.ndarray:
    """Admissible counts of one task in tie-breaking order: c_j first (when admissible),
    then ascending. Shape (|A_j|,), int64."""
    top = len(table) - 1
    adm = np.concatenate(([0], np.arange(min_nodes, top + 1, dtype=np.int64))) if min_nodes <= top \
        else np.zeros(1, dtype=np.int64)
    adm = adm.astype(np.int64)
    if current != 0 and (adm == current).any():
        adm = np.concatenate(([current], adm[adm != current]))
    return adm


def _best_own_count(table: np.ndarray, order: np.ndarray) -> int:
    """argmax of one task's table over its admissible counts, ties broken by ``order``."""
    vals = table[order]
    return int(order[int(np.argmax(vals))])


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
    (objective re-scored by :meth:`AllocationProblem.evaluate`). Raises nothing for a valid
    problem.
    """
    t0 = time.perf_counter()
    J, N = problem.num_tasks, problem.idle_nodes
    tables = problem.value_tables()
    orders = [
        _preference_order(tables[j], int(problem.current_nodes[j]), int(problem.min_nodes[j]))
        for j in range(J)
    ]
    own = np.array([_best_own_count(tables[j], orders[j]) for j in range(J)], dtype=np.int64)
    if int(own.sum()) <= N:
        counts = own
    else:
        counts = _knapsack(tables, orders, N)
    obj = problem.evaluate(counts)
    return Solution(counts=counts, objective=obj, bound=obj,
                    solve_ms=(time.perf_counter() - t0) * 1e3, solver="dp", status="optimal")


def _knapsack(tables: list[np.ndarray], orders: list[np.ndarray], N: int) -> np.ndarray:
    """The DP proper; returns counts (J,) int64."""
    J = len(tables)
    value = np.zeros(N + 1)  # best value with total count <= m (monotone in m)
    choices: list[np.ndarray] = []
    for j in range(J):
        f = tables[j]
        order = orders[j]
        top = len(f) - 1
        if len(order) <= _LOOP_MAX_COUNTS and N >= _LOOP_MIN_NODES:
            # one shifted max per admissible count, in preference order; strict '>' keeps
            # the earlier (preferred) count on ties
            new_value = np.full(N + 1, -np.inf)
            choice = np.zeros(N + 1, dtype=np.int64)
            for n in order.tolist():
                cand = value[:N + 1 - n] + f[n]
                tail = new_value[n:]
                better = cand > tail
                tail[better] = cand[better]
                choice[n:][better] = n
            value = new_value
            choices.append(choice)
            continue
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
        value = new_value
        choices.append(choice)
    best = value[N]
    m = int(np.argmax(value == best))  # smallest capacity reaching the optimum
    counts = np.zeros(J, dtype=np.int64)
    for j in range(J - 1, -1, -1):
        n = int(choices[j][m])
        counts[j] = n
        m -= n
    return counts


# ---------------------------------------------------------------- breakpoint DP (compiled)
_BRUTE_WIDTH = 32  # free segments up to this many counts are enumerated (measured faster
# than the log-time window below that width), longer ones use the sliding-window maximum
_TIE_RTOL = 1e-12  # ties: values within this fraction of sum_j max|f_j| are equal
_WORK_KEEP_ELEMENTS = 1 << 24  # keep per-thread scratch up to 128 MiB between calls


def _kernel_source(tab, tab_off, ns, ns_off, jmin, cur, n_idle, tie_rtol, brute_width, work):
    """Solve one instance; returns (counts (J,) int64, forward passes: 0 = shortcut, 1, 2).

    ``tab``/``tab_off``: the value tables f_j (n = 0..top_j) concatenated, with offsets
    (J+1,); ``ns``/``ns_off``: the curves' node counts Ns_j, same layout; ``work``: float64
    scratch of shape (>= 2 J + 4, N + 1), overwritten. Compiled with
    numba by :func:`_get_kernel`; plain Python otherwise (tests only).
    """
    J = len(jmin)
    N = n_idle
    counts = np.zeros(J, dtype=np.int64)
    # ---- shortcut: every task's own best count (c_j first, then ascending, exact ties)
    total = 0
    scale = 1.0
    for j in range(J):
        o = tab_off[j]
        top = tab_off[j + 1] - o - 1
        c = cur[j]
        if c != 0 and jmin[j] <= c <= top:
            best_n = c
            best_v = tab[o + c]
        else:
            best_n = 0
            best_v = tab[o]
        if tab[o] > best_v:
            best_n = 0
            best_v = tab[o]
        mag = abs(tab[o])
        for n in range(jmin[j], top + 1):
            v = tab[o + n]
            if abs(v) > mag:
                mag = abs(v)
            if v > best_v:
                best_v = v
                best_n = n
        counts[j] = best_n
        total += best_n
        scale += mag
    if total <= N:
        return counts, 0
    tol = tie_rtol * scale

    # ---- per task: useful options in ascending count order
    # kind 0: one breakpoint count lo (== hi); kind 1: free counts lo..hi, slope s
    cap = 0
    for j in range(J):
        cap += 2 * (ns_off[j + 1] - ns_off[j]) + 8
    cap *= 2
    o_kind = np.empty(cap, dtype=np.int64)
    o_lo = np.empty(cap, dtype=np.int64)
    o_hi = np.empty(cap, dtype=np.int64)
    o_s = np.empty(cap, dtype=np.float64)
    opt_off = np.zeros(J + 1, dtype=np.int64)
    maxcount = np.zeros(J, dtype=np.int64)
    cur_kept = np.zeros(J, dtype=np.bool_)
    bp = np.empty(2 * (ns_off[J] - ns_off[0]) + 8 * J + 8, dtype=np.int64)
    q = 0
    for j in range(J):
        o = tab_off[j]
        top = tab_off[j + 1] - o - 1
        lo_adm = jmin[j]
        c = cur[j]
        nb = 0
        bp[nb] = 0
        nb += 1
        cands = np.empty(6 + 2 * (ns_off[j + 1] - ns_off[j]), dtype=np.int64)
        nc = 0
        for x in (lo_adm, top, c - 1, c, c + 1):
            cands[nc] = x
            nc += 1
        for i in range(ns_off[j], ns_off[j + 1]):
            x = ns[i]
            cands[nc] = np.int64(np.floor(x))
            cands[nc + 1] = np.int64(np.ceil(x))
            nc += 2
        for i in range(nc):
            x = cands[i]
            if lo_adm <= x <= top:
                bp[nb] = x
                nb += 1
        srt = np.sort(bp[:nb])
        # unique
        nu = 0
        for i in range(nb):
            if nu == 0 or srt[i] != srt[nu - 1]:
                srt[nu] = srt[i]
                nu += 1
        pm = -np.inf  # max value over admissible counts already passed
        mc = 0
        for i in range(nu):
            b = srt[i]
            v = tab[o + b]
            if v > pm or (b == c and b != 0 and v >= pm):
                o_kind[q] = 0
                o_lo[q] = b
                o_hi[q] = b
                o_s[q] = 0.0
                q += 1
                mc = b
                if b == c:
                    cur_kept[j] = True
            if v > pm:
                pm = v
            if i + 1 < nu and b >= lo_adm and b > 0:
                e = srt[i + 1]
                if e - b >= 2:
                    s = (tab[o + e] - tab[o + b]) / (e - b)
                    if s > 0.0:
                        n = b + 1
                        while n < e and not (tab[o + n] > pm):
                            n += 1
                        if n < e:
                            o_kind[q] = 1
                            o_lo[q] = n
                            o_hi[q] = e - 1
                            o_s[q] = s
                            q += 1
                            mc = e - 1
                            if tab[o + e - 1] > pm:
                                pm = tab[o + e - 1]
        opt_off[j + 1] = q
        maxcount[j] = mc

    # ---- forward: two layers, rows 0..J. Row j is valid on columns lo_j..K_j, where
    # K_j = min(N, sum_{i<=j} maxcount_i) (the row is saturated beyond) and
    # lo_j = max(0, m_lo - sum_{i>j} maxcount_i): smaller capacities can never reach m_lo at
    # the end. A first pass uses m_lo = N - 1: when L_J(N - 1) is below the optimum (the
    # usual case), the smallest optimal capacity is N and the rows are much shorter; else
    # a second pass with m_lo = 0 finds the smallest optimal capacity.
    # work: (2 (J + 1) + 2, N + 1) scratch, reused between calls (no page faults)
    L0 = work[:J + 1]  # (first-axis slices keep the C layout: vectorised loops)
    L1 = work[J + 1:2 * J + 2]
    buf_a = work[2 * J + 2]
    buf_b = work[2 * J + 3]
    K = np.zeros(J + 1, dtype=np.int64)
    LO = np.zeros(J + 1, dtype=np.int64)
    rest = np.zeros(J + 1, dtype=np.int64)  # rest[j] = sum_{i>j} maxcount_i
    for j in range(J - 1, -1, -1):
        rest[j] = rest[j + 1] + maxcount[j]
    m_lo = max(N - 1, 0)
    for attempt in range(2):
        for j in range(J + 1):
            LO[j] = max(0, m_lo - rest[j])
        L0[0, 0] = 0.0
        L1[0, 0] = -np.inf
        has1 = False  # does L1_{j-1} hold any finite value
        for j in range(1, J + 1):
            o = tab_off[j - 1]
            kp = K[j - 1]
            kj = min(N, kp + maxcount[j - 1])
            K[j] = kj
            lj = LO[j]
            p0 = L0[j - 1]
            p1 = L1[j - 1]
            for k in range(kp + 1, kj + 1):
                p0[k] = p0[kp]
                p1[k] = p1[kp]
            c0 = L0[j]
            c1 = L1[j]
            for k in range(lj, kj + 1):
                c0[k] = -np.inf
                c1[k] = -np.inf
            any_free = False
            for t in range(opt_off[j - 1], opt_off[j]):
                lo = o_lo[t]
                if lo > kj:
                    break
                if o_kind[t] == 0:
                    # slices with a zero-based index: lets LLVM vectorise the loop
                    fb = tab[o + lo]
                    k0 = max(lj, lo)
                    cnt = kj + 1 - k0
                    src = p0[k0 - lo:k0 - lo + cnt]
                    dst = c0[k0:kj + 1]
                    for i in range(cnt):
                        v = src[i] + fb
                        if v > dst[i]:
                            dst[i] = v
                    if has1:
                        src = p1[k0 - lo:k0 - lo + cnt]
                        dst = c1[k0:kj + 1]
                        for i in range(cnt):
                            v = src[i] + fb
                            if v > dst[i]:
                                dst[i] = v
                    continue
                any_free = True
                hi = min(o_hi[t], kj)
                w = hi - lo + 1
                if w <= brute_width:
                    for n in range(lo, hi + 1):
                        fn = tab[o + n]
                        k0 = max(lj, n)
                        cnt = kj + 1 - k0
                        src = p0[k0 - n:k0 - n + cnt]
                        dst = c1[k0:kj + 1]
                        for i in range(cnt):
                            v = src[i] + fn
                            if v > dst[i]:
                                dst[i] = v
                    continue
                # outputs k = k0..kj read keys at m = k-hi..k-lo, clipped below at mb
                s = o_s[t]
                k0 = max(lj, lo)
                mb = max(0, k0 - hi)
                L = kj - lo - mb + 1  # key index i <-> m = mb + i, i = 0..L-1
                a = buf_a
                bb = buf_b
                for i in range(L):
                    a[i] = p0[mb + i] - s * (mb + i)
                p = 1  # a[i] = max of the keys at i-p+1..i (clipped at 0)
                while 2 * p <= w and p < L:
                    for i in range(p):
                        bb[i] = a[i]
                    cnt = L - p
                    x1 = a[p:L]
                    x2 = a[:cnt]
                    y1 = bb[p:L]
                    for i in range(cnt):
                        x = x1[i]
                        y = x2[i]
                        y1[i] = x if x >= y else y
                    a, bb = bb, a
                    p *= 2
                d = w - p  # window i-w+1..i = (i-p+1..i) U (i-d-p+1..i-d)
                # output k = lo + mb + i (window ends at m = k - lo = mb + i); with
                # f_j(n) = f_j(lo) + s (n - lo): value = key + f_j(lo) + s (k - lo)
                base = tab[o + lo]
                i0 = k0 - lo - mb
                for i in range(i0, min(d, L)):
                    v = a[i] + base + s * (mb + i)
                    if v > c1[lo + mb + i]:
                        c1[lo + mb + i] = v
                st = max(d, i0)
                if st < L:
                    cnt = L - st
                    x1 = a[st:L]
                    x2 = a[st - d:st - d + cnt]
                    y1 = c1[lo + mb + st:lo + mb + L]
                    for i in range(cnt):
                        x = x1[i]
                        y = x2[i]
                        if y > x:
                            x = y
                        v = x + base + s * (mb + st + i)
                        if v > y1[i]:
                            y1[i] = v
            if any_free:
                has1 = True
        kf = K[J]
        best = max(L0[J, kf], L1[J, kf])
        if m_lo == 0 or max(L0[J, m_lo], L1[J, m_lo]) < best - tol:
            break
        m_lo = 0

    # ---- the optimum, smallest capacity reaching it (within the tie tolerance)
    m = m_lo
    while m < kf and max(L0[J, m], L1[J, m]) < best - tol:
        m += 1
    target = max(L0[J, m], L1[J, m])
    allow0 = True
    allow1 = True
    # ---- backtrack: per task the most preferred count (c_j, then ascending) that keeps
    # the optimum reachable
    for j in range(J, 0, -1):
        o = tab_off[j - 1]
        if m > K[j]:
            m = K[j]
        p0 = L0[j - 1]
        p1 = L1[j - 1]
        c = cur[j - 1]
        chosen = -1
        chosen_layer = 0
        fb_v = -np.inf
        fb_n = -1
        fb_layer = 0
        # pass 0: c_j (a kept breakpoint) ; pass 1: every option ascending
        for ps in range(2):
            if chosen >= 0:
                break
            if ps == 0 and not cur_kept[j - 1]:
                continue
            for t in range(opt_off[j - 1], opt_off[j]):
                if chosen >= 0:
                    break
                lo = o_lo[t]
                hi = o_hi[t]
                if ps == 0:
                    if o_kind[t] != 0 or lo != c:
                        continue
                elif o_kind[t] == 0 and lo == c and cur_kept[j - 1]:
                    continue
                if lo > m:
                    break
                if hi > m:
                    hi = m
                for n in range(lo, hi + 1):
                    fn = tab[o + n]
                    if o_kind[t] == 0:
                        if allow0:
                            v = p0[m - n] + fn
                            if v >= target - tol:
                                chosen, chosen_layer = n, 0
                                break
                            if v > fb_v:
                                fb_v, fb_n, fb_layer = v, n, 0
                        if allow1:
                            v = p1[m - n] + fn
                            if v >= target - tol:
                                chosen, chosen_layer = n, 1
                                break
                            if v > fb_v:
                                fb_v, fb_n, fb_layer = v, n, 1
                    elif allow1:
                        v = p0[m - n] + fn
                        if v >= target - tol:
                            chosen, chosen_layer = n, 0
                            break
                        if v > fb_v:
                            fb_v, fb_n, fb_layer = v, n, 0
        if chosen < 0:  # cannot happen beyond rounding; keep the best candidate
            chosen, chosen_layer = fb_n, fb_layer
        counts[j - 1] = chosen
        m -= chosen
        if chosen_layer == 0:
            allow0, allow1 = True, False
            target = p0[m]
        else:
            allow0, allow1 = False, True
            target = p1[m]
    return counts, attempt + 1


_KERNEL = None
_KERNEL_ERROR: str | None = None
_WORK = threading.local()  # per thread: the kernel's scratch, kept to avoid page faults


def _workspace(J: int, N: int) -> np.ndarray:
    """Scratch of shape (>= 2 J + 4, >= N + 1) for this thread, grown when too small.
    Rows are indexed by the kernel, so a larger array is fine (columns: contiguous rows)."""
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
    """The compiled kernel (numba ``njit``, on-disk cache when a cache folder is writable),
    or None when numba is unavailable. Compiled on first use, not at import."""
    global _KERNEL, _KERNEL_ERROR
    if _KERNEL is not None or _KERNEL_ERROR is not None:
        return _KERNEL
    try:
        from numba import njit
    except ImportError as exc:  # fall back to the numpy reference DP
        _KERNEL_ERROR = f"numba not importable: {exc}"
        return None
    try:
        _KERNEL = njit(cache=True, nogil=True)(_kernel_source)
    except Exception:  # no writable cache locator (read-only install): compile per process
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _KERNEL = njit(cache=False, nogil=True)(_kernel_source)
    return _KERNEL


def _pack(problem: AllocationProblem):
    tables = problem.value_tables()
    J = problem.num_tasks
    tab_off = np.zeros(J + 1, dtype=np.int64)
    tab_off[1:] = np.cumsum([len(t) for t in tables])
    ns_off = np.zeros(J + 1, dtype=np.int64)
    ns_off[1:] = np.cumsum([len(x) for x in problem.node_counts])
    tab = np.concatenate(tables) if J else np.zeros(0)
    ns = np.concatenate(problem.node_counts) if J else np.zeros(0)
    return tab, tab_off, ns, ns_off


def solve_dp(problem: AllocationProblem) -> Solution:
    """Solve ``problem`` exactly (breakpoint DP with at most one free task, see the module
    docstring). Cost O(sum_j (|B_j| + sum over free segments log w) * K_j) with K_j <= N,
    memory O(J * N) for the two layers.

    Shortcut (exact): when the tasks' own best counts (argmax f_j, ties: c_j, then fewer
    nodes) sum to <= N, they are the answer without a DP.

    Ties are broken deterministically: the fewest total nodes among optimal solutions, then,
    from the last task backwards, each task's most preferred count (c_j, then fewer nodes)
    that keeps the optimum reachable. Values within 1e-12 of sum_j max|f_j| count as equal,
    so float rounding cannot flip a tie (the reference DP compares exactly; on exact ties
    both pick the same counts, on near-ties they may differ by that rounding).

    Returns a :class:`Solution` with ``status="optimal"`` and ``bound == objective``
    (objective re-scored by :meth:`AllocationProblem.evaluate`). Raises nothing for a valid
    problem. Without numba this is :func:`_solve_dp_reference`.
    """
    t0 = time.perf_counter()
    kernel = _get_kernel()
    if kernel is None:
        return _solve_dp_reference(problem)
    J = problem.num_tasks
    if J == 0:
        counts = np.zeros(0, dtype=np.int64)
    else:
        tab, tab_off, ns, ns_off = _pack(problem)
        counts, _ = kernel(tab, tab_off, ns, ns_off, problem.min_nodes, problem.current_nodes,
                           problem.idle_nodes, _TIE_RTOL, _BRUTE_WIDTH,
                           _workspace(J, problem.idle_nodes))
    obj = problem.evaluate(counts)
    return Solution(counts=counts, objective=obj, bound=obj,
                    solve_ms=(time.perf_counter() - t0) * 1e3, solver="dp", status="optimal")


def warm_up() -> float:
    """Compile (or load from numba's on-disk cache) the dp kernel by solving a tiny problem.

    Returns the seconds it took (about 1 s with the cache, 12-14 s on a 2-core machine without).
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
    """Why the compiled kernel is not in use (numba missing), or None when it is."""
    _get_kernel()
    return _KERNEL_ERROR
