"""Compiled kernel of the breakpoint DP of :mod:`.dp` (docs/architecture.md, "The dp backend").

The problem is BFTrainer's allocation MILP (Liu et al., arXiv 2106.12091, Section 3 eq. 1-9) at
the level of node counts, a multiple-choice knapsack; :mod:`.dp`'s module docstring derives
the method (breakpoints B_j, at most one "free" task, layers L0/L1, sliding-window maximum,
backtrack). Here it is split into its phases:

1. :func:`_own_best_counts`: the shortcut (every task's own best count fits the pool);
2. :func:`_all_breakpoints`, :func:`_capacity_price`: the breakpoints, and the reduced-cost
   fixing that rules out counts no optimal vector uses (Lagrangian bound of the capacity row);
3. :func:`_useful_options`: per task the undominated breakpoints and free segments, of the
   counts the fixing kept;
4. :func:`_forward`: the two DP layers over capacity (one or two passes);
5. :func:`_backtrack`: the argmax under the documented tie-breaking rule.

Units: counts and capacities are nodes (int64); values f_j(n) are the objective units of
:meth:`AllocationProblem.value_tables` (float64).

Every function here is plain Python restricted to what numba's ``njit`` compiles (no objects,
no Python containers). :func:`compile_kernel` compiles all of them together, the phases
inlined into :func:`kernel`; they live in this one file because numba's on-disk cache is
invalidated only by a change to the file of the function it compiled, not to the files of
its callees. Loops over tasks stay inside the phases: an array passed into an inlined
function with loops costs two reference-count updates per call, measurable per task (a
function without loops, or one called once per phase, costs nothing measurable).
"""

from __future__ import annotations

import types

import numpy as np


# ---------------------------------------------------------------- 1. shortcut
def _own_best_counts(tab, tab_off, jmin, cur):
    """Every task's own best count and the tie-tolerance scale (the exact shortcut).

    ``tab``: the value tables f_j(n), n = 0..top_j, concatenated (float64, objective units);
    ``tab_off``: (J+1,) int64 offsets into ``tab``; ``jmin``: (J,) Jmin_j; ``cur``: (J,) c_j
    (nodes). Returns (counts (J,) int64: argmax_n f_j(n) over {0} U [Jmin_j, top_j] with ties
    to c_j, then to fewer nodes; total: their sum in nodes; scale: 1 + sum_j max_n |f_j(n)|).
    When total <= N these counts are optimal (BFTrainer arXiv 2106.12091, Section 3: tasks interact
    only through the capacity constraint).
    """
    J = len(jmin)
    counts = np.zeros(J, dtype=np.int64)
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
    return counts, total, scale


# ---------------------------------------------------------------- 2-3. breakpoints, fixing, options
def _task_breakpoints(lo_adm, top, c, ns, ns_lo, ns_hi, bp):
    """The breakpoints B_j of one task, ascending and unique (int64 view, nodes).

    B_j = {0, Jmin_j, top_j, c_j - 1, c_j, c_j + 1, floor/ceil of every curve point Ns_j},
    each kept only inside [Jmin_j, top_j] (0 always); ``lo_adm`` = Jmin_j, ``top`` = top_j,
    ``c`` = c_j; the curve points are ``ns[ns_lo:ns_hi]`` (float64, nodes). ``bp``: int64
    scratch of length >= 6 + 2 (ns_hi - ns_lo), overwritten. f_j is linear between
    consecutive breakpoints (:mod:`.dp` docstring; BFTrainer arXiv 2106.12091, Section 3 curves).
    """
    nb = 0
    bp[nb] = 0
    nb += 1
    cands = np.empty(6 + 2 * (ns_hi - ns_lo), dtype=np.int64)
    nc = 0
    for x in (lo_adm, top, c - 1, c, c + 1):
        cands[nc] = x
        nc += 1
    for i in range(ns_lo, ns_hi):
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
    nu = 0  # unique, in place
    for i in range(nb):
        if nu == 0 or srt[i] != srt[nu - 1]:
            srt[nu] = srt[i]
            nu += 1
    return srt[:nu]


def _push_option(o_kind, o_lo, o_hi, o_s, q, kind, lo, hi, s):
    """Store option ``q`` (kind 0: breakpoint count lo == hi; kind 1: free counts lo..hi
    [nodes] of slope s [objective units per node]) in the (cap,) option arrays; returns q + 1.
    Layout of the breakpoint DP of :mod:`.dp` (problem: BFTrainer arXiv 2106.12091, Section 3)."""
    o_kind[q] = kind
    o_lo[q] = lo
    o_hi[q] = hi
    o_s[q] = s
    return q + 1


def _all_breakpoints(tab_off, ns, ns_off, jmin, cur):
    """Every task's breakpoints B_j (:func:`_task_breakpoints`), ascending, on one flat
    int64 array with (J+1,) int64 offsets: (bp_all, bp_off). Inputs as :func:`kernel`'s.
    Problem: BFTrainer arXiv 2106.12091, Section 3 (f_j linear between consecutive breakpoints)."""
    J = len(jmin)
    bp = np.empty(2 * (ns_off[J] - ns_off[0]) + 8 * J + 8, dtype=np.int64)
    bp_all = np.empty(2 * (ns_off[J] - ns_off[0]) + 6 * J + 8, dtype=np.int64)
    bp_off = np.zeros(J + 1, dtype=np.int64)
    q = 0
    for j in range(J):
        o = tab_off[j]
        bps = _task_breakpoints(jmin[j], tab_off[j + 1] - o - 1, cur[j], ns, ns_off[j],
                                ns_off[j + 1], bp)
        for i in range(len(bps)):
            bp_all[q] = bps[i]
            q += 1
        bp_off[j + 1] = q
    return bp_all, bp_off


def _capacity_price(tab, tab_off, bp_all, bp_off, jmin, cur, N, margin):
    """Reduced-cost fixing by the Lagrangian bound of the capacity row (Kellerer, Pferschy,
    Pisinger, "Knapsack Problems", Springer 2004, Section 11.2 for the multiple-choice knapsack):
    for any price lambda >= 0 [objective units per node] and counts n with sum_j n_j <= N,
    value(n) <= UB = lambda N + sum_j g_j with g_j = max_{k in A_j} (f_j(k) - lambda k).
    With LB the value of a known feasible vector, every vector worth >= LB - ``margin``
    (every optimal one, ties included) has g_j - (f_j(n_j) - lambda n_j) <= UB - LB + margin
    for each j: a count whose reduced value f_j(n) - lambda n is below thr_j = g_j - (UB -
    LB + margin) is in no such vector and need not be an option.

    lambda: the LP optimum of the relaxation, the slope at which the tasks' concave hulls
    (over their breakpoints: f_j is linear between them, so g_j is attained at one) fill N
    when taken steepest first. LB: the larger of the vector of each task's smallest
    maximiser of f_j(k) - lambda k (sum <= N) improved by giving the nodes left to the best
    single increase, up to four times, and the current counts c_j when they are admissible
    and fit. ``bp_all``/``bp_off``: :func:`_all_breakpoints`; other inputs as
    :func:`kernel`'s; ``margin`` in objective units (the tie tolerance and rounding).
    Returns (lambda, thr (J,) float64, LB); thr is -inf everywhere (no fixing) when
    lambda = 0 or no bound applies.
    """
    J = len(jmin)
    thr = np.full(J, -np.inf)
    lam = _hull_price(tab, tab_off, bp_all, bp_off, N)
    if not lam > 0.0:
        return 0.0, thr, -np.inf
    x = np.zeros(J, dtype=np.int64)
    ub = _price_maximisers(tab, tab_off, bp_all, bp_off, lam, lam * N, thr, x)
    lb = _feasible_bound(tab, tab_off, bp_all, bp_off, jmin, cur, N, x)
    if lb == -np.inf:
        thr[:] = -np.inf
        return lam, thr, lb
    gap = max(ub - lb, 0.0) + margin
    for j in range(J):
        thr[j] -= gap
    return lam, thr, lb


def _hull_price(tab, tab_off, bp_all, bp_off, N):
    """The LP price lambda of :func:`_capacity_price` [objective units per node]: the slope
    at which the rising segments of the tasks' upper concave hulls over their breakpoints,
    taken steepest first, fill ``N`` nodes (0.0 when they never do)."""
    J = len(tab_off) - 1
    cap = bp_off[J]
    seg_s = np.empty(cap, dtype=np.float64)
    seg_n = np.empty(cap, dtype=np.int64)
    hull = np.empty(cap, dtype=np.int64)
    m = 0
    for j in range(J):  # the upper concave hull of (b, f_j(b)) over B_j, rising part
        o = tab_off[j]
        h = 0
        for i in range(bp_off[j], bp_off[j + 1]):
            b = bp_all[i]
            while h >= 2:
                a = hull[h - 2]
                c = hull[h - 1]
                if (tab[o + c] - tab[o + a]) * (b - a) > (tab[o + b] - tab[o + a]) * (c - a):
                    break
                h -= 1
            hull[h] = b
            h += 1
        for i in range(h - 1):
            a = hull[i]
            b = hull[i + 1]
            s = (tab[o + b] - tab[o + a]) / (b - a)
            if not s > 0.0:
                break
            seg_s[m] = s
            seg_n[m] = b - a
            m += 1
    order = np.argsort(-seg_s[:m])
    filled = 0
    for i in range(m):
        filled += seg_n[order[i]]
        if filled >= N:
            return seg_s[order[i]]
    return 0.0


def _price_maximisers(tab, tab_off, bp_all, bp_off, lam, start, thr, x):
    """For price ``lam``: each task's g_j = max over its breakpoints of f_j(b) - lam b into
    ``thr`` (J,) and its smallest maximiser into ``x`` (J,) int64 (nodes). Returns ``start``
    + sum_j g_j, added in task order (objective units): with ``start`` = lam N,
    :func:`_capacity_price`'s UB."""
    total = start
    for j in range(len(x)):
        o = tab_off[j]
        g = -np.inf
        for i in range(bp_off[j], bp_off[j + 1]):
            b = bp_all[i]
            v = tab[o + b] - lam * b
            if v > g:
                g = v
                x[j] = b
        thr[j] = g
        total += g
    return total


def _feasible_bound(tab, tab_off, bp_all, bp_off, jmin, cur, N, x):
    """:func:`_capacity_price`'s LB (objective units; -inf when none applies): the value of
    the maximisers ``x`` (J,) when they fit ``N``, improved by giving the nodes left to the
    best single increase up to four times (``x`` is updated), or of the current counts
    ``cur`` when they are admissible, fit and are worth more."""
    J = len(x)
    total = 0
    for j in range(J):
        total += x[j]
    lb = -np.inf
    if total <= N:
        left = N - total
        for _ in range(4):  # the best single increase within the nodes left
            gain = 0.0
            bj = -1
            bn = 0
            for j in range(J):
                o = tab_off[j]
                xj = x[j]
                top = tab_off[j + 1] - o - 1
                e = xj + left
                if jmin[j] <= e <= top and tab[o + e] - tab[o + xj] > gain:
                    gain = tab[o + e] - tab[o + xj]
                    bj = j
                    bn = e
                for i in range(bp_off[j], bp_off[j + 1]):
                    b = bp_all[i]
                    if xj < b <= e and tab[o + b] - tab[o + xj] > gain:
                        gain = tab[o + b] - tab[o + xj]
                        bj = j
                        bn = b
            if bj < 0:
                break
            left -= bn - x[bj]
            x[bj] = bn
        lb = 0.0
        for j in range(J):
            lb += tab[tab_off[j] + x[j]]
    fits = 0
    for j in range(J):
        c = cur[j]
        if c != 0 and not (jmin[j] <= c <= tab_off[j + 1] - tab_off[j] - 1):
            fits = N + 1
            break
        fits += c
    if fits <= N:
        v = 0.0
        for j in range(J):
            v += tab[tab_off[j] + cur[j]]
        if v > lb:
            lb = v
    return lb


def _useful_options(tab, tab_off, bp_all, bp_off, jmin, cur, lam, thr):
    """Every task's useful options for the breakpoint DP of :mod:`.dp`, ascending in count.

    ``tab``/``tab_off``: f_j(n) tables (float64, objective units) with (J+1,) offsets;
    ``bp_all``/``bp_off``: the breakpoints (:func:`_all_breakpoints`); ``jmin``, ``cur``:
    (J,) Jmin_j, c_j; ``lam``, ``thr``: the price and thresholds of :func:`_capacity_price`
    (a count n with f_j(n) - lam n < thr_j is in no optimal vector; thr = -inf keeps all). A
    breakpoint is kept when its value beats every smaller count (c_j also on equality); a
    free segment of positive slope keeps its counts from the first one beating every smaller
    count (dominance argument of :mod:`.dp`); of those, only counts that pass the threshold
    (on a segment f_j(n) - lam n is linear: they form an interval). Returns (o_kind, o_lo,
    o_hi (cap,) int64; o_s (cap,) float64: option t is counts o_lo..o_hi, a breakpoint (kind
    0, lo == hi) or free (kind 1, slope o_s in objective units per node); opt_off (J+1,)
    int64: task j's options are opt_off[j]..opt_off[j+1]-1; maxcount (J,) int64: largest
    useful count [nodes], mincount (J,) int64: smallest (-1: the task has none); cur_kept
    (J,) bool: c_j is a kept breakpoint). Problem: BFTrainer arXiv 2106.12091, Section 3 eq. 1-9.
    """
    J = len(jmin)
    cap = 2 * bp_off[J] + 4 * J
    o_kind = np.empty(cap, dtype=np.int64)
    o_lo = np.empty(cap, dtype=np.int64)
    o_hi = np.empty(cap, dtype=np.int64)
    o_s = np.empty(cap, dtype=np.float64)
    opt_off = np.zeros(J + 1, dtype=np.int64)
    maxcount = np.zeros(J, dtype=np.int64)
    mincount = np.full(J, -1, dtype=np.int64)
    cur_kept = np.zeros(J, dtype=np.bool_)
    q = 0
    for j in range(J):
        o = tab_off[j]
        lo_adm = jmin[j]
        c = cur[j]
        t = thr[j]
        b0 = bp_off[j]
        nu = bp_off[j + 1] - b0
        pm = -np.inf  # max value over admissible counts already passed
        mc = 0
        for i in range(nu):
            b = bp_all[b0 + i]
            v = tab[o + b]
            if (v > pm or (b == c and b != 0 and v >= pm)) and v - lam * b >= t:
                q = _push_option(o_kind, o_lo, o_hi, o_s, q, 0, b, b, 0.0)
                mc = b
                if mincount[j] < 0:
                    mincount[j] = b
                if b == c:
                    cur_kept[j] = True
            if v > pm:
                pm = v
            if i + 1 < nu and b >= lo_adm and b > 0:
                e = bp_all[b0 + i + 1]
                if e - b >= 2:
                    s = (tab[o + e] - tab[o + b]) / (e - b)
                    if s > 0.0:
                        n = b + 1
                        while n < e and not (tab[o + n] > pm):
                            n += 1
                        if tab[o + e - 1] > pm:
                            pm = tab[o + e - 1]
                        hi = e - 1
                        while n <= hi and tab[o + n] - lam * n < t:
                            n += 1
                        while hi >= n and tab[o + hi] - lam * hi < t:
                            hi -= 1
                        if n <= hi:
                            q = _push_option(o_kind, o_lo, o_hi, o_s, q, 1, n, hi, s)
                            mc = hi
                            if mincount[j] < 0:
                                mincount[j] = n
        opt_off[j + 1] = q
        maxcount[j] = mc
    return o_kind, o_lo, o_hi, o_s, opt_off, maxcount, mincount, cur_kept


# ---------------------------------------------------------------- 4. forward layers
def _max_plus_into(dst, src, add, cnt):
    """dst[i] = max(dst[i], src[i] + add) for i = 0..cnt-1 (none if cnt <= 0), in place,
    strict '>'.

    ``dst``, ``src``: float64 slices (capacities in nodes) of length cnt, indexed from 0
    (lets LLVM vectorise the loop); ``add``: f_j(n), objective units. The shift-and-max step
    L_j(k) >= L_{j-1}(k - n) + f_j(n) of the knapsack DP (problem: BFTrainer
    arXiv 2106.12091, Section 3).
    """
    for i in range(cnt):  # a select, not a branch: LLVM vectorises it (max + blend)
        v = src[i] + add
        d = dst[i]
        dst[i] = v if v > d else d


def _relax_free_window(tab, o, p0, c1, lo, hi, s, lj, kj, buf_a, buf_b):
    """c1(k) = max(c1(k), max_{n=lo..hi} L0_{j-1}(k - n) + f_j(n)) for k = max(lj, lo)..kj.

    One free segment counts lo..hi [nodes] of slope ``s`` (objective units per node) of task
    j (values ``tab[o:]``); ``p0`` = L0_{j-1}, ``c1`` = L1_j: (N+1,) float64 rows, capacity
    in nodes. As f_j(n) = f_j(lo) + s (n - lo), the inner max is f_j(lo) + s (k - lo) +
    max_{m = k-hi..k-lo} (L0_{j-1}(m) - s m): a sliding-window maximum of width w = hi-lo+1
    (:mod:`.dp` docstring; problem: BFTrainer arXiv 2106.12091, Section 3), here by the van Herk /
    Gil-Werman method (van Herk, Pattern Recognit. Lett. 13(7), 1992; Gil and Werman, IEEE
    TPAMI 15(5), 1993): cut the keys into blocks of w, take the running maximum forwards
    (``buf_a``) and backwards (``buf_b``) inside each block; a window of w keys spans at
    most two blocks, so its maximum is max(backward[first key], forward[last key]). About
    three passes over the row whatever w. ``buf_a``, ``buf_b``: (N+1,) float64 scratch,
    overwritten.
    """
    w = hi - lo + 1
    # outputs k = k0..kj read keys at m = k-hi..k-lo, clipped below at mb
    k0 = max(lj, lo)
    mb = max(0, k0 - hi)
    L = kj - lo - mb + 1  # key index i <-> m = mb + i, i = 0..L-1
    fwd = buf_a  # fwd[i]: max of the keys from i's block start to i
    bwd = buf_b  # bwd[i]: max of the keys from i to i's block end
    b0 = 0
    while b0 < L:
        b1 = min(b0 + w, L)
        run = -np.inf
        for i in range(b0, b1):
            v = p0[mb + i] - s * (mb + i)
            if v > run:
                run = v
            fwd[i] = run
        run = -np.inf
        for i in range(b1 - 1, b0 - 1, -1):
            v = p0[mb + i] - s * (mb + i)
            if v > run:
                run = v
            bwd[i] = run
        b0 = b1
    # output k = lo + mb + i: its window holds the keys max(0, i-w+1)..i; with
    # f_j(n) = f_j(lo) + s (n - lo): value = window max + f_j(lo) + s (k - lo)
    base = tab[o + lo]
    i0 = k0 - lo - mb
    for i in range(i0, min(w, L)):  # the window is keys 0..i, all in the first block
        v = fwd[i] + base + s * (mb + i)
        if v > c1[lo + mb + i]:
            c1[lo + mb + i] = v
    st = max(w, i0)
    if st < L:
        cnt = L - st
        x1 = fwd[st:L]
        x2 = bwd[st - w + 1:st - w + 1 + cnt]
        y1 = c1[lo + mb + st:lo + mb + L]
        for i in range(cnt):
            x = x1[i]
            y = x2[i]
            x = y if y > x else x
            v = x + base + s * (mb + st + i)
            d = y1[i]
            y1[i] = v if v > d else d


def _forward_pass(tab, tab_off, options, maxcount, N, start, has1, brute_width, L0, L1, K, LO,
                  H1, buf_a, buf_b):
    """One forward pass of the two layers: rows j = ``start``..J of ``L0`` and ``L1`` (rows
    below ``start`` are valid already, with their ``K``; ``has1``: does L1_{start-1} hold a
    finite value; ``start`` >= 1).

    ``L0``, ``L1``: (J+1, N+1) float64 (objective units over capacity 0..N nodes, N the
    pool); row j is valid on columns LO[j]..K[j], with K[j] = min(N, sum_{i<=j} maxcount_i)
    (the row is saturated beyond, copied forward here) and LO[j] (read; :func:`_forward`).
    ``K``: (J+1,) int64, written from ``start``; ``H1``: (J+1,) bool, H1[j] = L1_j holds a
    finite value, written from ``start``. ``options``: the option arrays and offsets of
    :func:`_useful_options`. A breakpoint updates both layers; a free segment moves L0_{j-1}
    into L1_j, enumerated when at most ``brute_width`` counts wide, else by
    :func:`_relax_free_window`. Method: :mod:`.dp` docstring (problem: BFTrainer
    arXiv 2106.12091, Section 3). The task loop stays here, not in a per-task function: passing
    arrays into a function costs reference counting per call.
    """
    o_kind, o_lo, o_hi, o_s, opt_off = options
    L0[0, 0] = 0.0
    L1[0, 0] = -np.inf
    for j in range(start, len(maxcount) + 1):  # has1: does L1_{j-1} hold any finite value
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
                fb = tab[o + lo]
                k0 = max(lj, lo)
                cnt = kj + 1 - k0
                _max_plus_into(c0[k0:kj + 1], p0[k0 - lo:k0 - lo + cnt], fb, cnt)
                if has1:
                    _max_plus_into(c1[k0:kj + 1], p1[k0 - lo:k0 - lo + cnt], fb, cnt)
                continue
            any_free = True
            hi = min(o_hi[t], kj)
            if hi - lo + 1 <= brute_width:
                for n in range(lo, hi + 1):
                    k0 = max(lj, n)
                    cnt = kj + 1 - k0
                    _max_plus_into(c1[k0:kj + 1], p0[k0 - n:k0 - n + cnt], tab[o + n], cnt)
                continue
            _relax_free_window(tab, o, p0, c1, lo, hi, o_s[t], lj, kj, buf_a, buf_b)
        if any_free:
            has1 = True
        H1[j] = has1


def _forward(tab, tab_off, options, maxcount, floor, n_idle, tol, brute_width, slack, work,
             shared, prev_LO, prev_K, prev_H1):
    """The forward DP over capacity: one pass with m_lo = max(``floor``, min(N - ``slack``,
    sum_j maxcount_j)), a second with m_lo = ``floor`` only when L_J(m_lo) is within ``tol``
    of the optimum (else the smallest optimal capacity is above m_lo and the first pass's
    shorter rows suffice). ``floor`` [nodes]: no optimal vector uses fewer nodes (the sum of
    the tasks' smallest options, :func:`_capacity_price`; 0 without fixing).

    ``slack`` [nodes]: how far below N the first pass looks for the smallest optimal
    capacity. The optimum rarely leaves many nodes unused (on the real log's whole-machine
    replay at most 30 of 2,000-3,600), and the first pass grows by ``slack`` columns per
    row only where rows are not full anyway, so a slack of a few Jmax spares the full
    second pass that m_lo = N - 1 needed in 3 % of the instances, the slowest ones.

    Rows kept from the previous solve on this ``work`` (:func:`_common_prefix`): its first
    ``shared`` tasks equal this problem's and N is the same, so its rows 0..``shared`` are
    this problem's as far as they reach: row j is kept while its valid columns
    ``prev_LO[j]``.. cover this pass's LO[j] (``prev_K``, ``prev_H1``: its row ends and
    free-layer flags). The first pass starts after the last kept row; the second pass
    (m_lo = 0) recomputes every row.

    ``work``: (>= 2 J + 4, N + 1) float64 scratch (rows: L0 from 0, L1 from H = (rows - 2)
    // 2, two window buffers last; first-axis slices keep the C layout), overwritten but for
    kept rows; ``tol``: tie tolerance in objective units. Returns (L0, L1 (J+1, N+1) views
    of ``work``, K (J+1,) int64 row ends, LO (J+1,) int64 each row's first valid column,
    H1 (J+1,) bool, m_lo [nodes], best = max(L0_J(K_J), L1_J(K_J)) [objective units],
    passes 1 or 2, rows kept). Method: :mod:`.dp` docstring (problem: BFTrainer
    arXiv 2106.12091, Section 3).
    """
    J = len(maxcount)
    N = n_idle
    H = (work.shape[0] - 2) // 2
    L0 = work[:J + 1]  # (first-axis slices keep the C layout: vectorised loops)
    L1 = work[H:H + J + 1]
    buf_a = work[work.shape[0] - 2]
    buf_b = work[work.shape[0] - 1]
    K = np.zeros(J + 1, dtype=np.int64)
    LO = np.zeros(J + 1, dtype=np.int64)
    H1 = np.zeros(J + 1, dtype=np.bool_)
    rest = np.zeros(J + 1, dtype=np.int64)  # rest[j] = sum_{i>j} maxcount_i
    for j in range(J - 1, -1, -1):
        rest[j] = rest[j + 1] + maxcount[j]
    m_lo = max(min(N - max(slack, 1), rest[0]), floor, 0)
    kept = 0
    for attempt in range(2):
        for j in range(J + 1):
            LO[j] = max(0, m_lo - rest[j])
        K[0] = 0
        H1[0] = False
        kept = 0
        if attempt == 0:
            while kept < shared and prev_LO[kept + 1] <= LO[kept + 1]:
                kept += 1
            for j in range(1, kept + 1):
                K[j] = prev_K[j]
                LO[j] = prev_LO[j]
                H1[j] = prev_H1[j]
        _forward_pass(tab, tab_off, options, maxcount, N, kept + 1, H1[kept], brute_width,
                      L0, L1, K, LO, H1, buf_a, buf_b)
        kf = K[J]
        best = max(L0[J, kf], L1[J, kf])
        if m_lo <= floor or max(L0[J, m_lo], L1[J, m_lo]) < best - tol:
            break
        m_lo = max(floor, 0)
    return L0, L1, K, LO, H1, m_lo, best, attempt + 1, kept


def _same_run(a, a_off, b, b_off, k):
    """Whether run k of the flat array ``a`` (``a[a_off[k]:a_off[k+1]]``) equals run k of
    ``b`` element for element (same length; exact, floats included). ``a_off``/``b_off``:
    int64 offsets as :func:`kernel`'s (value tables, option arrays)."""
    a0 = a_off[k]
    b0 = b_off[k]
    n = a_off[k + 1] - a0
    if b_off[k + 1] - b0 != n:
        return False
    for i in range(n):
        if a[a0 + i] != b[b0 + i]:
            return False
    return True


def _common_prefix(tab, tab_off, options, n_idle, prev_tab, prev_tab_off, prev_options,
                   prev_n_idle, prev_rows):
    """How many leading tasks this problem shares with the previous solve on the same
    workspace: equal options (:func:`_useful_options`, after the fixing of
    :func:`_capacity_price`: kind, counts, slope) and f_j tables (float64, exact), with the
    same N (``n_idle``) and at most ``prev_rows`` - 1 (the rows it left; 0: none). Inputs as
    :func:`kernel`'s, ``prev_*`` the previous solve's. The DP's rows 0..shared depend on
    those tasks' options and values and N only (the curve points, Jmin_j and c_j enter
    through the options; BFTrainer arXiv 2106.12091, Section 3 at count level; :func:`_forward`).
    """
    if prev_rows <= 0 or prev_n_idle != n_idle:
        return 0
    o_kind, o_lo, o_hi, o_s, opt_off = options
    p_kind, p_lo, p_hi, p_s, p_off = prev_options
    lim = min(len(tab_off), len(prev_tab_off), prev_rows) - 1
    k = 0
    while (k < lim and _same_run(o_kind, opt_off, p_kind, p_off, k)
           and _same_run(o_lo, opt_off, p_lo, p_off, k)
           and _same_run(o_hi, opt_off, p_hi, p_off, k)
           and _same_run(o_s, opt_off, p_s, p_off, k)
           and _same_run(tab, tab_off, prev_tab, prev_tab_off, k)):
        k += 1
    return k


# ---------------------------------------------------------------- 5. backtrack
def _backtrack_start(L0, L1, K, m_lo, best, tol):
    """Where the backtrack starts: (m, target), m the smallest capacity >= ``m_lo`` [nodes]
    whose value max(L0_J(m), L1_J(m)) is within ``tol`` of ``best`` (objective units), target
    that value. ``L0``/``L1``: (J+1, N+1) float64 layers; ``K``: (J+1,) int64 row ends.
    Tie rule "fewest total nodes" of :mod:`.dp` (problem: BFTrainer arXiv 2106.12091, Section 3).
    """
    J = len(K) - 1
    kf = K[J]
    m = m_lo
    while m < kf and max(L0[J, m], L1[J, m]) < best - tol:
        m += 1
    return m, max(L0[J, m], L1[J, m])


def _backtrack(tab, tab_off, cur, options, cur_kept, L0, L1, K, m_lo, best, tol, counts):
    """Recover the optimal counts from the stored layers, into ``counts`` (J,) int64 [nodes].

    From the last task backwards, each task takes its most preferred count (c_j first when it
    is a kept breakpoint, then every option ascending) whose L_{j-1}(m - n) + f_j(n) reaches
    the target (within ``tol``, objective units) in a layer it may come from: a breakpoint
    continues L0 or L1, a free count moves L0_{j-1} into L1_j. Every layer of task j-1
    through which that count reaches the target stays open for the earlier tasks (the next
    target is the smaller of their values): committing to one layer could lose an earlier
    task's preferred count that only the other reaches. ``L0``/``L1``: (J+1, N+1)
    float64 layers; ``K``: (J+1,) int64 row ends; ``options``, ``cur_kept``: of
    :func:`_useful_options`; ``cur``: (J,) c_j; ``m_lo``, ``best``: of :func:`_forward`.
    Method and tie-breaking rule: :mod:`.dp` docstring (problem: BFTrainer arXiv 2106.12091,
    Section 3). The task loop stays here: passing arrays into a function costs reference counting.
    """
    o_kind, o_lo, o_hi, o_s, opt_off = options
    m, target = _backtrack_start(L0, L1, K, m_lo, best, tol)
    allow0 = True  # the layers of task j-1 the target may come from
    allow1 = True
    for j in range(len(cur), 0, -1):
        o = tab_off[j - 1]
        m = min(m, K[j])
        p0 = L0[j - 1]
        p1 = L1[j - 1]
        chosen = -1
        layer = 0
        new0 = False  # the layers of task j-1 through which the chosen count reaches the target
        new1 = False
        fb_v = -np.inf  # fallback: the best miss (needed for float rounding only)
        fb_n = -1
        fb_layer = 0
        for ps in range(2):  # pass 0: c_j when a kept breakpoint; pass 1: the other options
            for t in range(opt_off[j - 1], opt_off[j]):
                kind = o_kind[t]
                lo = o_lo[t]
                if (kind == 0 and lo == cur[j - 1] and cur_kept[j - 1]) != (ps == 0):
                    continue
                if lo > m:
                    break
                for n in range(lo, min(o_hi[t], m) + 1):
                    for lay in range(2):  # the layer of task j-1 the count continues
                        if kind == 0 and (allow0 if lay == 0 else allow1):
                            v = (p0[m - n] if lay == 0 else p1[m - n]) + tab[o + n]
                        elif kind == 1 and lay == 0 and allow1:
                            v = p0[m - n] + tab[o + n]
                        else:
                            continue
                        if v >= target - tol:
                            if chosen < 0:
                                chosen = n
                                layer = lay
                            if lay == 0:
                                new0 = True
                            else:
                                new1 = True
                            continue
                        if v > fb_v:
                            fb_v, fb_n, fb_layer = v, n, lay
                    if chosen >= 0:
                        break
                if chosen >= 0:
                    break
            if chosen >= 0:
                break
        if chosen < 0:  # cannot happen beyond rounding; keep the best candidate
            chosen, layer = fb_n, fb_layer
            new0, new1 = layer == 0, layer == 1
        counts[j - 1] = chosen
        m -= chosen
        allow0, allow1 = new0, new1
        if new0 and new1:
            target = min(p0[m], p1[m])
        elif new0:
            target = p0[m]
        else:
            target = p1[m]


# ---------------------------------------------------------------- kernel
def kernel(tab, tab_off, ns, ns_off, jmin, cur, n_idle, tie_rtol, brute_width, slack, work,
           prev):
    """Solve one instance; returns (counts (J,) int64 [nodes], forward passes: 0 = shortcut,
    1, 2, and what the next solve on ``work`` may keep: K (J+1,) int64, LO (J+1,) int64, H1
    (J+1,) bool of :func:`_forward` (empty after the shortcut, which leaves ``work`` as it
    was), then the number of rows kept from ``prev``, then the options of
    :func:`_useful_options` (o_kind, o_lo, o_hi, o_s, opt_off; empty after the shortcut)).

    ``tab``/``tab_off``: the value tables f_j (n = 0..top_j; float64, objective units)
    concatenated, with offsets (J+1,); ``ns``/``ns_off``: the curves' node counts Ns_j, same
    layout; ``jmin``, ``cur``: (J,) int64 Jmin_j, c_j; ``n_idle``: N [nodes]; ``tie_rtol``:
    values within tie_rtol * (1 + sum_j max|f_j|) are equal; ``brute_width``: free segments
    up to this many counts are enumerated; ``slack``: the first forward pass's reach below N
    [nodes] (:func:`_forward`); ``work``: float64 scratch of shape
    (>= 2 J + 4, N + 1), overwritten but for the rows kept; ``prev``: the previous solve on
    ``work`` that left rows there: (its tab, tab_off as above, its N, its K, LO, H1 and its
    five option arrays as returned), with empty arrays when none (:func:`_common_prefix`).
    Same ``brute_width`` and ``slack`` on one ``work``.

    Before the DP, :func:`_capacity_price` fixes the counts that no optimal vector uses
    (reduced-cost fixing with the Lagrangian bound), which narrows the rows to the columns
    the remaining options can reach; should the DP then miss the known feasible value (float
    rounding only), it runs again without the fixing. Breakpoint DP of :mod:`.dp` for
    BFTrainer's problem (arXiv 2106.12091, Section 3 eq. 1-9 at count level). Compiled by
    :func:`compile_kernel`; plain Python otherwise (tests only).
    """
    (prev_tab, prev_tab_off, prev_n_idle, prev_K, prev_LO, prev_H1, p_kind, p_lo, p_hi, p_s,
     p_off) = prev
    prev_options = (p_kind, p_lo, p_hi, p_s, p_off)
    counts, total, scale = _own_best_counts(tab, tab_off, jmin, cur)
    if total <= n_idle:
        none_i = np.zeros(0, dtype=np.int64)
        return (counts, 0, none_i, none_i, np.zeros(0, dtype=np.bool_), 0,
                (none_i, none_i, none_i, np.zeros(0, dtype=np.float64),
                 np.zeros(1, dtype=np.int64)))
    tol = tie_rtol * scale
    J = len(jmin)
    bp_all, bp_off = _all_breakpoints(tab_off, ns, ns_off, jmin, cur)
    margin = (J + 4) * tol + 1e-9 * scale
    lam, thr, lb = _capacity_price(tab, tab_off, bp_all, bp_off, jmin, cur, n_idle, margin)
    for attempt in range(2):  # (one call site per phase: numba inlines each once)
        o_kind, o_lo, o_hi, o_s, opt_off, maxcount, mincount, cur_kept = _useful_options(
            tab, tab_off, bp_all, bp_off, jmin, cur, lam, thr)
        emptied = mincount.min() < 0  # rounding dropped a task's every count
        floor = n_idle  # (emptied: the pass below is discarded, so one column of rows)
        shared = 0
        if not emptied:
            floor = 0
            for j in range(J):
                floor += mincount[j]
            if attempt == 0:
                shared = _common_prefix(tab, tab_off, (o_kind, o_lo, o_hi, o_s, opt_off),
                                        n_idle, prev_tab, prev_tab_off, prev_options,
                                        prev_n_idle, len(prev_K))
        L0, L1, K, LO, H1, m_lo, best, passes, kept = _forward(
            tab, tab_off, (o_kind, o_lo, o_hi, o_s, opt_off), maxcount, floor, n_idle, tol,
            brute_width, slack, work, shared, prev_LO, prev_K, prev_H1)
        if attempt == 1 or not (emptied or best < lb - margin):
            break
        # rounding defeated the fixing (an option of every optimal vector was dropped):
        # again without it, from the first row
        lam = 0.0
        thr[:] = -np.inf
    options = (o_kind, o_lo, o_hi, o_s, opt_off)
    _backtrack(tab, tab_off, cur, options, cur_kept, L0, L1, K, m_lo, best, tol, counts)
    return counts, passes, K, LO, H1, kept, options


_COMPILED = (_own_best_counts, _task_breakpoints, _push_option, _all_breakpoints,
             _capacity_price, _hull_price, _price_maximisers, _feasible_bound, _useful_options,
             _max_plus_into, _relax_free_window, _forward_pass, _forward, _same_run,
             _common_prefix,
             _backtrack_start, _backtrack, kernel)


def compile_kernel(njit, cache):
    """The compiled :func:`kernel`: numba's ``njit`` (passed in: numba is imported lazily)
    applied to every function of this module, the compiled ones calling each other.

    The phases are inlined into the kernel at numba IR level (``inline="always"``), so the
    compiled code is one function as if written in one piece (no calls in the hot loops;
    not inlining them costs about 25% at 100 tasks x 4,734 nodes). Each function is copied
    into one private namespace whose names are bound to the compiled versions, so the
    module's own functions stay plain Python.
    ``cache``: numba's on-disk cache. Only dispatchers are built here; numba compiles (or
    loads from its cache) on the first call. Raises what ``njit`` raises (no writable cache
    folder with ``cache=True``). Problem and method: :mod:`.dp` docstring (BFTrainer
    arXiv 2106.12091, Section 3).
    """
    namespace = dict(globals())
    for fn in _COMPILED:
        copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                                  fn.__closure__)
        copy.__qualname__ = fn.__qualname__
        copy.__doc__ = fn.__doc__
        inline = "never" if fn is kernel else "always"
        namespace[fn.__name__] = njit(cache=cache, nogil=True, inline=inline)(copy)
    return namespace["kernel"]
