"""The choice ``backend=None`` makes, as a pure function: a tuning table's rows, the
backends usable here and the op's preference in, (backend, why) out.

``choose`` reads no file, no device and no registry: ``core.registry`` gathers what it
needs (the table of this GPU model from ``core.tables``, the backends registered and
runnable on the device, the op's preferred backend and its small-size rule) and caches
the answer per call shape.

- The row of the nearest shape (same op, dtype, mode and option key; distance = summed
  |log2| ratios of the dims, infinite across the bands the op names in
  ``OpSpec.key_bands``, and across alignment classes (``_aligned``) and the values of the
  dims the op names in ``OpSpec.key_exact`` unless no row of the call's class and values is
  near) names the backend when it lies within ``NEAR`` (where that backend is not in
  ``usable``, the fastest of the row's usable ones): alone at its own shape, else together
  with the next nearest within ``NEAR`` (``NEIGHBOURS`` in all, ``_blend``); a 16-bit call
  with no rows of its dtype reads a sibling dtype's (``SIBLING_DTYPES``). A row that timed
  one backend alone speaks only at its own shape where other rows compare backends
  (``_comparing``). ``usable`` is what runs here less what the op excludes for the shape
  (``OpSpec.default_excludes``).
- No row near: the backend that won a strict majority of the op's rows (``_table_vote``),
  else the one nearest the best over them by geometric mean.
- No table or no evidence: the op's small-size rule, else its preferred backend.
- ``pick_best``: a row's winner from its backends' effective and device times (``tune``
  writes it). Where the row's fastest backend takes ``DEVICE_BOUND_MS`` or more on the
  device, ``by="queued"`` (the default) lets device time decide (``decided_by_device``,
  also for rows written before the rule); ``by="loop"`` ranks by the larger of device and
  loop time always.
"""

from __future__ import annotations

import math


def _band(x: int, edges) -> int:
    """Which band of ``edges`` (ascending upper bounds) ``x`` lies in: 0 for x <= edges[0]."""
    return sum(x > e for e in edges)


def _aligned(key) -> bool:
    """A key's alignment class: every dim past the first (the widths: a row's columns,
    matmul's N and K, attention's sequence lengths and head dim) a multiple of 8. The first
    dim counts rows, products or heads, which no kernel vectorizes over; a 1-D key is its
    own width."""
    return all(x % 8 == 0 for x in (key[1:] if len(key) > 1 else key))


def _distance(a, b, exact=(), bands=(), classes: bool = True) -> float:
    """Summed |log2| ratios of the dims; infinite across alignment classes (``_aligned``:
    every width a multiple of 8 in one key, not in the other; ``classes=False``: not):
    libraries choose other kernels where a width is odd (cuBLAS at 4097x4095x1023 and
    8192x50257x768 is 1.8-4.4x slower than our CUDA matmul, at 1024x3072x768 it is the
    fastest), so an odd row does not speak for an aligned call where a row of the call's
    class is near (``choose``). (Classes per dim, the first included, split the rows finer
    than the kernels do: left out in turn (harness.choice_cv), the rows' choices were within
    3% of the fastest at 376 of 472 H200 rows and 421 of 514 H100 rows, with these classes
    at 384 and 432.)
    Infinite too across the bands of ``bands`` ((dim index, upper bounds) pairs, the op's
    ``OpSpec.key_bands``: matmul's M <= 16 runs GEMV kernels, launch-bound, and above it
    tile kernels), and where a dim listed in ``exact`` (indices into the key, the op's
    ``OpSpec.key_exact``) differs: attention's kernels are built per head dim, and the
    fastest at head dim 80 says nothing of head dim 128."""
    if len(a) != len(b) or (classes and _aligned(a) != _aligned(b)):
        return math.inf
    for i, edges in bands:
        if _band(a[i], edges) != _band(b[i], edges):
            return math.inf
    for i in exact:
        if a[i] != b[i]:
            return math.inf
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b))


# A row this far (summed log2 ratios: 64x in one dim) or nearer is used. Left out in turn, each
# table row's choice from the others (harness.choice_cv) was within 3% of its fastest at
# NEAR 3 / 4 / 5 / 6 / 8: H200 364 / 367 / 376 / 376 / 374 of 472 rows, H100 413 / 414 / 415 /
# 421 / 421 of 514: a farther row of the same class spoke better than the op's vote.
NEAR = 6.0
BY = ("queued", "loop", "device")  # what a choice ranks by (``choose``)

# Away from a tuned shape, the NEIGHBOURS nearest rows within NEAR speak together: each
# backend's time over each row's own choice, log-averaged with weights
# 1 / (distance + WEIGHT_OFFSET) ** 2 (``_blend``). Left out in turn (harness.choice_cv),
# the choice was within 3% of the row's fastest at 622 of 760 H100 rows and 391 of 472
# H200 rows, against 606 of 762 and 384 of 472 from the nearest row alone; 2 to 4
# neighbours, weight powers 1 to 2 and coverage 0.3 to 1.0 all landed within 5 rows of that.
NEIGHBOURS = 3
WEIGHT_OFFSET = 0.25
COVERAGE = 0.5  # a backend counts where rows of at least this share of the weight timed it


def choose(table: dict | None, table_name: str, op: str, key, dn: str | None, mode: str, options: str, *,
           usable, preferred: str, small: str | None = None, by: str = "queued",
           among=None, exact=(), bands=()) -> tuple[str, str]:  # fmt: skip
    """(backend, why) for a call of ``op`` with shape key ``key`` in dtype ``dn`` (a dtype
    name) and ``mode``, from ``table`` (None: no table; ``table_name`` names it in the
    why). ``usable``: the backends that run here (a container of names); ``preferred``:
    the op's first usable preferred backend; ``small``: the op's backend for a problem of
    this size (``OpSpec.small_backend``), or None.

    ``by="queued"`` (the default): the larger of device and loop time, but device time
    alone where the row's fastest kernel takes ``DEVICE_BOUND_MS`` or more
    (``decided_by_device``: its host cost hides behind queued work). ``by="loop"``: the
    larger of device and loop time always (a plain eager loop with nothing queued to hide
    host cost behind). ``by="device"``: the fastest by device time
    alone, for a call whose host cost is paid elsewhere (inside a CUDA graph, a compiled
    graph, or a model that runs several ops under one autograd node); ``among`` limits the
    backends considered (e.g. those with node-free entry points). ``exact``: key dims a row
    must match to be near (``_distance``); where no row of the call's values of them is
    near, the nearest row of any values speaks (said in the why). ``bands``: (key dim,
    upper bounds) pairs; a row of another band never speaks for the call (``_distance``).
    Rows written before device times were kept fall back to their effective times."""
    if by not in BY:
        raise ValueError(f"by: one of {', '.join(map(repr, BY))}, got {by!r}")
    standalone = by != "device"  # by "loop" or "queued": a row's own choice, the vote, the heuristics
    out = None
    if table is not None and key is not None and dn is not None:
        dn, src = _row_dtype(table, op, dn, mode, options)
        rows = _comparing(list(_rows(table, op, dn, mode, options)), key)
        near, any_dims = [], ""
        for classes in (True, False):
            # no row of the call's exact dims near: the nearest of any is the best evidence
            # left (a vote over far shapes would be weaker); none of its alignment class
            # near: the other class's near rows (left out in turn, they named a backend
            # within 3% of the fastest at 72 of 84 rows where the vote spoke before). The
            # why says which.
            other = "" if classes else OTHER_CLASS
            near, any_dims = _within_near(rows, key, exact, bands, classes), other
            if exact and not near:
                near = _within_near(rows, key, (), bands, classes)
                any_dims = other + ANY_DIMS
            if near:
                break
        if near:
            dist, row = near[0]
            times, metric = _row_times(row, by)
            fastest = "fastest"
            row_best = row_choice(row, by)
            near_pick = pick = _row_pick(row, by, usable, among)
            if standalone and among is None and row_best not in usable:
                fastest = f"the fastest of the usable ({row_best}, the fastest, is not usable here)"
            blended = ""
            if pick is not None and dist > 0 and len(near) > 1:  # not a tuned shape: neighbours together
                pick, blended = _blend(near, by, usable, among, near_pick)
            if pick is not None:
                out = (
                    pick,
                    f"table {table_name}: nearest row {row['shape']}"
                    + (f" {options}" if options else "")
                    + src
                    + any_dims
                    + (
                        f" (a row of {row['measured_on']}'s table, same architecture)"
                        if row.get("measured_on")
                        else ""
                    )
                    + " "
                    f"(distance {dist:.2f}): {near_pick} was {fastest} there "
                    f"({times[near_pick]:.4g} ms by {metric}; "
                    + ", ".join(f"{b} {t:.4g}" for b, t in times.items() if b != near_pick)
                    + ")"
                    + blended,
                )
        if out is None and standalone and among is None:
            out = _table_vote(table, table_name, op, dn, mode, options, usable, key, by, exact, bands)
            if out is None:  # its alignment class is split: every row votes
                out = _table_vote(table, table_name, op, dn, mode, options, usable, by=by)
            if out is not None and src:
                out = (out[0], out[1] + src)
    if out is None:
        why = "no tuning table for this device" if table is None else "no table row near this shape"
        if small is not None and key is not None and standalone and among is None and small in usable:
            out = (small, f"heuristic ({why}): the op's backend for a problem of this size "
                          "(OpSpec.small_backend)")  # fmt: skip
        else:
            out = (preferred, f"heuristic ({why}): first available of the op's preferred backends")
    return out


OTHER_CLASS = " (no row of the call's alignment class near: the other class's)"
ANY_DIMS = " (no row near with the call's exact key dims, OpSpec.key_exact: the nearest of any)"


def _within_near(rows, key, exact, bands, classes: bool = True) -> list:
    """The NEIGHBOURS rows nearest ``key`` (``_distance``) within NEAR, as (distance, row),
    nearest first (the table's order among equals)."""
    dists = [(_distance(tuple(row["key"]), key, exact, bands, classes), i) for i, row in enumerate(rows)]
    return [(d, rows[i]) for d, i in sorted(dists)[:NEIGHBOURS] if d <= NEAR]


def _row_times(row: dict, by: str) -> tuple[dict, str]:
    """A row's times as ``by`` ranks them, and their name for a why."""
    device = row.get("device")
    times = device if by == "device" and device else deciding_times(row, by)
    return times, "device time" if times is not row["times"] else "the larger of device and loop time"


def _row_pick(row: dict, by: str, usable, among) -> str | None:
    """What one row names for a call: its own choice (``row_choice``: ties and a paired
    verify's verdict included) where that serves (ranked by loop or queued time, every
    backend considered, the choice usable here), else the fastest of the usable ones (and
    of ``among``) by the times ``by`` ranks; None if the row timed none of them."""
    row_best = row_choice(row, by)
    if by != "device" and among is None and row_best in usable:
        return row_best
    avail = _serving(_row_times(row, by)[0], usable, among)
    return min(avail, key=avail.get) if avail else None


def _serving(times: dict, usable, among) -> dict:
    """The times of the backends that may serve the call: usable, and of ``among`` if given."""
    return {b: t for b, t in times.items() if b in usable and (among is None or b in among)}


def _blend(near: list, by: str, usable, among, nearest_pick: str) -> tuple[str, str]:
    """(pick, the why's clause) from several near rows ((distance, row), nearest first):
    each usable backend's time over each row's own pick (``_row_pick``; its pick scores 0,
    a backend the row timed no slower than it a hair above), log-averaged with weights
    1 / (distance + WEIGHT_OFFSET) ** 2 over the rows that timed it. A backend timed by
    rows of less than COVERAGE of the weight is not ranked. The lowest wins; the nearest
    row's pick wins ties. Without a ranked backend, the nearest row's pick and no clause."""
    score: dict[str, float] = {}
    weight: dict[str, float] = {}
    total = 0.0
    for dist, row in near:
        mine = _row_pick(row, by, usable, among)
        times, _ = _row_times(row, by)
        base = times.get(mine) if mine is not None else None
        if not base or base <= 0:
            continue
        w = 1.0 / (dist + WEIGHT_OFFSET) ** 2
        total += w
        for b, t in _serving(times, usable, among).items():
            if not t or t <= 0:
                continue
            rel = 0.0 if b == mine else max(math.log(t / base), 1e-3)
            score[b] = score.get(b, 0.0) + w * rel
            weight[b] = weight.get(b, 0.0) + w
    ranked = {b: score[b] / weight[b] for b in score if weight[b] >= COVERAGE * total}
    if not ranked:
        return nearest_pick, ""
    pick = min(ranked, key=lambda b: (ranked[b], b != nearest_pick))
    others = ", ".join(f"{r['shape']} (distance {d:.2f})" for d, r in near[1:])
    order = ", ".join(f"{b} {math.exp(v):.3g}x" for b, v in sorted(ranked.items(), key=lambda kv: kv[1]))
    return pick, (
        f"; with the next nearest, {others}, weighted 1/(distance + {WEIGHT_OFFSET})^2: {pick} ranks "
        f"first by time over each row's choice (weighted geomean: {order})"
    )


# Where the table has no row of a 16-bit call's dtype for the op and mode, the rows of these
# dtypes speak for it, in this order: the same kernels run with the same bytes moved (fp16 and
# bf16), or the same shapes with twice the bytes (fp32: the MNIST ops were tuned in fp32 only).
# Without them the op's fixed preference list chooses, blind to fp32 rows near the shape that
# name a faster backend. fp32 calls borrow no 16-bit rows: their kernels differ (TF32, fp32
# dots).
SIBLING_DTYPES = {"fp16": ("bf16", "fp32"), "bf16": ("fp16", "fp32")}


def _row_dtype(table, op, dn, mode, options) -> tuple[str, str]:
    """(dtype whose rows serve a call of dtype ``dn``, a note for the reason when it is not
    ``dn`` itself); ``dn`` when no dtype has rows."""
    for alt in (dn, *SIBLING_DTYPES.get(dn, ())):
        if next(_rows(table, op, alt, mode, options), None) is not None:
            return alt, "" if alt == dn else f" (the table has no {op} {dn} {mode} rows: its {alt} rows)"
    return dn, ""


def has_rows(table: dict, op: str, options: str) -> bool:
    """Whether ``table`` has a row of ``op`` with option key ``options`` (any dtype, mode)."""
    return any(row["op"] == op and row.get("options", "") == options for row in table["rows"])


def _rows(table, op, dn, mode, options):
    """The table's rows of ``op`` in dtype ``dn`` and ``mode`` for a call's option key (a
    row without "options" serves every option set)."""
    for row in table["rows"]:
        if (row.get("op") == op and row.get("dtype") == dn and row.get("mode") == mode
                and row.get("options", options) == options):  # fmt: skip
            yield row


def _comparing(rows, key=None):
    """The rows that speak for a call at ``key``: a row that timed one backend alone (a
    verify run's, ``rows_from_verify``: torch where the default was torch) compares nothing,
    so where other rows compare backends it speaks only at its own shape; where no row
    compares, all of them do. (bn_relu_pool2d bf16 at 1024x64x14x14: triton 6.7x faster
    than torch, whose lone row at 256x64x14x14 would otherwise name it.)"""
    if not any(len(r["times"]) > 1 for r in rows):
        return rows
    own = None if key is None else tuple(key)
    return [r for r in rows if len(r["times"]) > 1 or tuple(r["key"]) == own]


VOTE_MIN_ROWS = 3  # rows of an op / dtype / mode before they speak for far shapes
# Without a majority, the backend nearest the best on average speaks only when its geometric
# mean of time over each row's best leads the next backend's by more than this
NEAREST_LEAD = 0.01


def _table_vote(table, table_name, op, dn, mode, options, usable, key=None, by="queued", exact=(), bands=()):
    """(backend, why) for a shape no row is near: the backend this GPU's table found fastest
    at the most shapes of the op, dtype and mode, or None where the table has no such row.
    The op's fixed preference list knows nothing of the GPU, so at far shapes it can name a
    backend the table found slower at most rows. A strict majority of at least VOTE_MIN_ROWS
    rows speaks; without one, the backend timed at every row whose time over each row's best
    has the least geometric mean (NEAREST_LEAD ahead of the next). Where VOTE_MIN_ROWS rows
    share the call's alignment class, bands and exact dims (``_distance`` finite), only they
    vote: a kernel's speed at odd widths says little about aligned ones, as ``_distance`` says."""
    rows = _comparing(list(_rows(table, op, dn, mode, options)), key)
    alike = [r for r in rows if key is not None and _distance(tuple(r["key"]), key, exact, bands) < math.inf]
    alike_note = ""
    if len(alike) >= VOTE_MIN_ROWS and len(alike) < len(rows):
        rows, alike_note = alike, " of its alignment class" + (" and band" if bands else "")
    wins, ratios, n_rows = {}, {}, 0
    for row in rows:
        n_rows += 1
        row_best = row_choice(row, by)
        wins[row_best] = wins.get(row_best, 0) + 1
        times = deciding_times(row, by)
        best_t = min(times.values())
        for b, t in times.items():
            if best_t > 0 and t > 0:
                ratios.setdefault(b, []).append(math.log(t / best_t))
    if n_rows < VOTE_MIN_ROWS:
        return None  # too few rows: no evidence for this GPU
    where = f"table {table_name}: no row near this shape; "
    ok = [b for b in wins if b in usable]
    if ok:
        pick = max(ok, key=wins.get)
        if 2 * wins[pick] > n_rows:
            won = f"{pick} was fastest at {wins[pick]} of its {n_rows} {op} {dn} {mode} rows{alike_note}"
            return pick, where + won
    # no majority: the geometric mean over the rows, among backends timed at every one (a
    # row made from a verify run times only torch and its choice: rows_from_verify)
    gm = {b: math.exp(sum(r) / len(r)) for b, r in ratios.items() if len(r) == n_rows and b in usable}
    if not gm:
        return None
    ranked = sorted(gm, key=gm.get)
    pick = ranked[0]
    if len(ranked) > 1 and gm[ranked[1]] <= gm[pick] * (1 + NEAREST_LEAD):
        return None  # no backend is nearer the best than the others: no evidence either way
    head = where + f"no backend won most of its {n_rows} {op} {dn} {mode} rows{alike_note}; "
    mean = f"geometric mean of its time over each row's best {gm[pick]:.2f}"
    if len(ranked) == 1:  # rows from a verify run: torch is the one backend every row timed
        return pick, head + f"{pick} is the only backend timed at every one of them ({mean})"
    others = ", ".join(f"{b} {gm[b]:.2f}" for b in ranked[1:])
    return pick, head + f"{pick} was nearest the best over them ({mean}; {others})"


# Loop times of launch-bound calls move by 10-30% between runs on one host, so a
# loop-time lead this small is noise; device time is stable to a few percent, and it is
# what a call inside a CUDA graph or a compiled graph costs.
TIE = 0.05
# Device times this close are the same kernel speed (the median of one run moves ~1%); among
# them the larger of device and loop time decides: a launcher with more host cost loses
# its plain-loop calls even with the faster kernel.
DEVICE_TIE = 0.01


# A row whose fastest backend takes this long on the device is judged by device time: a
# kernel of 20 us or more outlasts the host cost of launching it (15-30 us a call on the
# GPU hosts, ours and PyTorch's alike), so in a model with work in flight the kernels queue
# behind each other and the host cost is hidden; a plain loop of that one call alone
# would be host-bound and name the backend with the cheapest launch instead. Below it the
# call is launch-bound anywhere, and the larger of device and loop time decides.
DEVICE_BOUND_MS = 0.02


def decided_by_device(times: dict, device: dict | None) -> bool:
    """Whether backends with these effective and device times (ms) are judged by device
    time alone: every one has a device time and the fastest takes DEVICE_BOUND_MS or more."""
    return bool(device) and set(times) <= set(device) and min(device.values()) >= DEVICE_BOUND_MS


def deciding_times(row: dict, by: str = "queued") -> dict:
    """The times a table row's backends are ranked by: device times where they decide
    (``by="queued"`` or ``"device"``), else the effective ones."""
    device = row.get("device")
    return device if by != "loop" and decided_by_device(row["times"], device) else row["times"]


def row_choice(row: dict, by: str = "queued") -> str:
    """A table row's choice under today's rules: ``pick_best`` of its times where device
    time decides, else the ``best`` it was written with (which may carry a paired verify's
    verdict, ``rebuild_table --verify``). ``by="loop"``: ``pick_best`` without the device
    rule, where device time decides the row."""
    device = row.get("device")
    if not decided_by_device(row["times"], device):
        return row["best"]
    return pick_best(row["times"], device, device_rule=by != "loop")


def pick_best(times: dict, device: dict, device_rule: bool = True) -> str:
    """The table's choice from per-backend effective and device times (see TIE, DEVICE_TIE,
    DEVICE_BOUND_MS; ``device_rule=False``: the effective times decide, device time only
    among near-ties)."""
    if device_rule and decided_by_device(times, device):
        fastest = min(device.values())
        return min((b for b in device if device[b] <= fastest * (1 + DEVICE_TIE)), key=times.get)
    first = min(times, key=times.get)
    close = [b for b, t in times.items() if t <= times[first] * (1 + TIE) and b in device]
    if not close:
        return first
    fastest = min(device[b] for b in close)
    return min((b for b in close if device[b] <= fastest * (1 + DEVICE_TIE)), key=times.get)
