"""The bootstrap replicates of norm_vs_property: each replicate's statistics, computed with numpy.

``norm_vs_property_ci.sql`` takes its intervals from them, and a paired comparison its per-replicate
differences (:mod:`pipeline.analysis.paired`). :func:`item_sets` reads the staged rows of
``stg_analysis_values`` / ``stg_analysis_groups``; :func:`pipeline.analysis.replicates.stage_replicates`
writes table ``stg_bootstrap_replicates`` (columns probe_set, property, statistic, b, value, method; value NaN
or infinite where a statistic is undefined) with :func:`replicate_statistics` below the switch-over and
:mod:`pipeline.analysis.m_out_of_n` above it.

Method: Poisson bootstrap, seeded. In replicate b every item gets a weight w ~ Poisson(1) (capped at 10;
P(w > 10) = 1e-8) and appears w times in the resample; all properties of a probe set share the replicate's
weights, so a replicate is one resample of items. Each replicate statistic is computed as on the full sample,
average ranks recomputed over the resample (an item's w copies form one tie group: the same as numpy.repeat
then scipy.stats.spearmanr).
Weights are reproducible anywhere: u = mix32(mix32((seed * 2654435769 + b) mod 2^32) xor pos), where pos is
the item's 0-based position among its probe set's embedded items ordered by item_id, and mix32 is the
"lowbias32" integer hash (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16,
mod 2^32); w = the number of k in 0..9 with u >= floor(P(Poisson(1) <= k) * 2^32).
``sql/bootstrap_replicate_keys.sql`` (the keys mix32(...) of a batch) and ``sql/paired_weights.sql`` (the
weights of a paired comparison's units) hash the same numbers in SQL.

Samples and statistics are those of ``norm_vs_property.sql``: per (probe set, property) the items with the
property (spearman, pearson_log_norm, partial_spearman_n_tokens where n_tokens varies, partial_spearman_zipf
where every item has a zipf), and, where only some have a zipf, the items that do (partial_spearman_zipf).

Cost: no sort per replicate. The order of every variable over a sample is that of the full sample, so an
item's weighted average rank in a replicate is the running weight through its tie group, less half the
group's weight beyond one: a cumulative sum in the fixed order (items are kept in norm order, so norm's needs
no reordering), or for a variable with few distinct values the running sum of its per-value weights. Ranks
are centred on their exact mean (resample size + 1) / 2 and the correlations are weighted central moments.
Weights and ranks are whole and half-whole numbers, exact in float64.

Large samples: m-out-of-n bootstrap. A replicate of the Poisson bootstrap costs O(n) (about 0.1 s of CPU per
million items and three properties), so 1,000 of them over millions of items cost minutes to an hour, more
than embedding the items on a GPU (benchmarks/analyses_scale.py). An item set of more than ``switch_n`` items
(``bootstrap_switch_n``) is resampled instead by drawing m = min(``bootstrap_m``, n) of its n items with
replacement in every replicate (Bickel, Goetze & van Zwet 1997, Statistica Sinica 7:1-31): each statistic T is
computed on the m draws as above (:mod:`pipeline.analysis.m_out_of_n`, which looks the draws up in DuckDB and
never loads a large sample whole), and the value stored is
T_n + sqrt(m/n) * (T*_m - T_n), T_n its value on all n items; the percentiles of the stored values are then the
m-out-of-n percentile interval T_n + sqrt(m/n) * (quantile of T*_m - T_n), which estimates the spread of T at n
from its spread at m (a correlation's standard error goes as 1/sqrt(size)). A replicate then costs O(m log m)
whatever n. Draws are reproducible anywhere: draw j (0 <= j < m) of replicate b is the item at 0-based position
(mix32(key xor 2j) * 2^32 + mix32(key xor (2j + 1))) mod n among the sample's items ordered by pos (the
probe set's position where the sample covers the whole set), key = mix32((seed * 2654435769 + b) mod 2^32) as
above; all samples of one item set share them. A paired comparison's two sides draw the same items
(:mod:`pipeline.analysis.paired`), and the difference of two stored values is the rescaled deviation of the
difference, so its intervals are the m-out-of-n ones too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import duckdb
import numpy as np

# floor(P(Poisson(1) <= k) * 2^32), k = 0..9: a weight is how many of them its hash reaches
THRESHOLDS = np.array([1580030168, 3160060337, 3950075421, 4213413783, 4279248373, 4292415291, 4294609777,
                       4294923276, 4294962463, 4294966817], dtype=np.uint32)
# (replicate x item) cells computed at once. Small enough for the CPU's caches (a float64 array of a chunk is
# 512 KiB): measured on 2 cores, 1 << 22 (32 MiB arrays) was 3x slower. Replicates are independent: chunks change
# only the cost, and an item set larger than this is computed one replicate at a time.
CHUNK_CELLS = 1 << 16
# draws of one m-out-of-n replicate hash counters 0 .. 2m - 1 in 32 bits
MAX_M = 2**31 - 1


class Buffers:
    """(replicate x item) arrays reused by name from chunk to chunk: a fresh array of a chunk's size costs more
    in page faults than the arithmetic done in it (measured 4x for a multiplication)."""

    def __init__(self) -> None:
        self._pool: dict[tuple[str, str], np.ndarray] = {}

    def __call__(self, name: str, shape: tuple[int, int], dtype: type = np.float64) -> np.ndarray:
        size = shape[0] * shape[1]
        key = (name, np.dtype(dtype).str)
        if key not in self._pool or self._pool[key].size < size:
            self._pool[key] = np.empty(max(size, CHUNK_CELLS), dtype)
        return self._pool[key][:size].reshape(shape)


def mix32(x: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """The lowbias32 integer hash of each element of a uint32 array, in place (arithmetic mod 2^32)."""
    scratch = np.empty_like(x) if scratch is None else scratch
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None)):
        np.right_shift(x, np.uint32(shift), out=scratch)
        x ^= scratch
        if factor is not None:
            x *= np.uint32(factor)
    return x


def replicate_keys(seed: int, first: int, count: int) -> np.ndarray:
    """The hash keys of replicates first .. first + count - 1 (as ``sql/bootstrap_replicate_keys.sql``)."""
    b = np.arange(first, first + count, dtype=np.uint64)
    return mix32(((np.uint64(seed % 2**32) * np.uint64(2654435769) + b) % np.uint64(2**32)).astype(np.uint32))


def draw_positions(keys: np.ndarray, m: int, n: int) -> np.ndarray:
    """(len(keys) x m) uint64 positions in 0 .. n - 1: the m-out-of-n bootstrap's draws in each replicate.

    Draw j of a replicate is (mix32(key xor 2j) * 2^32 + mix32(key xor (2j + 1))) mod n: 64 random bits, so
    no position is favoured by more than n / 2^64."""
    if not 1 <= m <= MAX_M:
        raise ValueError(f"m={m!r}: give a whole number of draws from 1 to {MAX_M}")
    h = keys.astype(np.uint32)[:, None] ^ np.arange(2 * m, dtype=np.uint32)[None, :]
    halves = mix32(h).reshape(len(keys), m, 2).astype(np.uint64)
    return ((halves[..., 0] << np.uint64(32)) | halves[..., 1]) % np.uint64(n)


def poisson_weights(keys: np.ndarray, positions: np.ndarray, buffers: Buffers | None = None) -> np.ndarray:
    """Weights (len(keys) x len(positions), float64) of the items at 0-based ``positions`` in each replicate."""
    buffers = Buffers() if buffers is None else buffers
    shape = (len(keys), len(positions))
    h = np.bitwise_xor(keys[:, None], positions.astype(np.uint32)[None, :], out=buffers("hash", shape, np.uint32))
    mix32(h, buffers("hash_scratch", shape, np.uint32))
    count, reached = buffers("count", shape, np.uint8), buffers("reached", shape, np.bool_)
    count[:] = 0
    for threshold in THRESHOLDS:
        count += np.greater_equal(h, threshold, out=reached)
    w = buffers("w", shape)
    w[:] = count
    return w


@dataclass
class Order:
    """A variable's fixed order over an item set, from which its weighted ranks in any replicate follow.

    A rank is the running weight through the item's tie group less (the group's weight - 1) / 2, i.e. (the
    running weight before the group + the running weight through it + 1) / 2. The running weights are a
    cumulative sum of the weights in value order or, for few distinct values, of per-value sums (no
    reordering). Norm's items are already in value order.
    """

    codes: np.ndarray  # dense code of each item's value, in the item set's order (equal values share one)
    n_codes: int
    counted: bool  # few distinct values: per-value sums
    perm: np.ndarray | None = None  # the items in value order; None: already in it (norm)
    ends: np.ndarray | None = None  # last index (in value order) of each tie group; None: no ties
    _flat: dict[int, np.ndarray] = field(default_factory=dict)  # per chunk size: replicate * n_codes + code

    @classmethod
    def of(cls, values: np.ndarray, presorted: bool = False) -> Order:
        """The order of ``values`` (``presorted``: already ascending); one sort, dense codes from it."""
        n = len(values)
        perm = None if presorted else np.argsort(values, kind="stable")
        ranked = values if perm is None else values[perm]
        # a new code where the value changes (NaNs are one value, as DuckDB groups them)
        change = ranked[1:] != ranked[:-1]
        if ranked.dtype.kind == "f":
            change &= ~(np.isnan(ranked[1:]) & np.isnan(ranked[:-1]))
        ranked_codes = np.concatenate([[0], np.cumsum(change)])
        n_codes = int(ranked_codes[-1]) + 1 if n else 0
        codes = ranked_codes if perm is None else np.empty_like(ranked_codes)
        if perm is not None:
            codes[perm] = ranked_codes
        order = cls(codes=codes, n_codes=n_codes, counted=not presorted and n_codes * 8 <= n)
        if not order.counted:
            order.perm = perm
            if n_codes < n:
                order.ends = np.flatnonzero(np.diff(ranked_codes, append=n_codes))
        return order

    def centred_ranks(self, w: np.ndarray, size: np.ndarray, out: np.ndarray, buffers: Buffers) -> np.ndarray:
        """Into ``out``: each item's weighted average rank in each replicate (a row of ``w``) less the
        replicate's mean rank (``size`` + 1) / 2, i.e. (before + through - size) / 2 (half-whole numbers,
        exact in float64 in any order of the steps)."""
        rows = len(w)
        if self.counted:
            per_value = np.bincount(self._flat_codes(rows), weights=w.ravel(), minlength=rows * self.n_codes)
            through = np.cumsum(per_value.reshape(rows, self.n_codes), axis=1)
        else:
            ws = w if self.perm is None else np.take(w, self.perm, axis=1, out=buffers("sorted", w.shape), mode="clip")
            through = np.cumsum(ws, axis=1, out=out if self.perm is None and self.ends is None else
                                buffers("through", w.shape))
            if self.ends is None:  # a group is an item: before = through - w
                through += through
                through -= ws
                through -= size
                through *= 0.5
                return through if through is out else np.take(through, self.codes, axis=1, out=out, mode="clip")
            through = np.take(through, self.ends, axis=1)
        table = np.empty_like(through)
        table[:, 0] = through[:, 0]
        np.add(through[:, 1:], through[:, :-1], out=table[:, 1:])
        table -= size
        table *= 0.5
        return np.take(table, self.codes, axis=1, out=out, mode="clip")

    def _flat_codes(self, rows: int) -> np.ndarray:
        if rows not in self._flat:
            self._flat[rows] = (np.arange(rows)[:, None] * self.n_codes + self.codes[None, :]).ravel()
        return self._flat[rows]


@dataclass
class Sample:
    """One sample of a (probe set, property): its value order and the statistics it gives."""

    probe_set: str
    property: str
    statistics: tuple[str, ...]
    value: Order
    x_value: np.ndarray | None  # value less its mean over the sample (Pearson), None where not needed


@dataclass
class ItemSet:
    """Items of one probe set that one or more samples share, in norm order, with their fixed orders."""

    positions: np.ndarray  # uint32: each item's position in its probe set (its weights hash from it)
    in_norm_order: np.ndarray  # the samples' rows (ordered by position) in norm order
    norm: Order
    x_log_norm: np.ndarray  # ln(norm) less its mean over the item set
    n_tokens: np.ndarray
    zipf: np.ndarray
    static: np.ndarray | None = None  # rows 1, x_log_norm, x_log_norm^2, and per Pearson sample x, x^2, x * x_log_norm
    tokens: Order | None = None  # built where a sample needs it
    zipf_order: Order | None = None
    samples: list[Sample] = field(default_factory=list)


@dataclass(frozen=True)
class SampleSpec:
    """A sample of ``norm_vs_property.sql`` before its rows are read: a (probe set, property) group's items with
    the property (``zipf_only``: those that also have a zipf), how many, and the statistics they give."""

    probe_set: str
    property: str
    group_key: int
    set_id: object  # the probe set's id in stg_analysis_groups: groups of one probe set share item sets
    zipf_only: bool
    n: int
    statistics: tuple[str, ...]


def sample_specs(con: duckdb.DuckDBPyConnection) -> list[SampleSpec]:
    """The samples of the staged rows (``stg_analysis_values`` / ``stg_analysis_groups`` on ``con``), by (probe
    set, property): counted in SQL, so a sample's rows are read only where its route needs them."""
    specs = []
    for key, probe_set, prop, set_id, n_items, n_zipf, tokens_vary in con.execute(
            "select v.group_key, g.probe_set, g.property, g.set_id, count(*), count(v.zipf), "
            "min(v.n_tokens) < max(v.n_tokens) from stg_analysis_values as v "
            "inner join stg_analysis_groups as g using (group_key) group by all order by 2, 3").fetchall():
        zipf_control = prop != "zipf" and n_zipf > 0
        statistics = ("spearman", "pearson_log_norm", *(("partial_spearman_n_tokens",) if tokens_vary else ()),
                      *(("partial_spearman_zipf",) if zipf_control and n_zipf == n_items else ()))
        specs.append(SampleSpec(probe_set, prop, key, set_id, False, n_items, statistics))
        if zipf_control and n_zipf < n_items:
            specs.append(SampleSpec(probe_set, prop, key, set_id, True, n_zipf, ("partial_spearman_zipf",)))
    return specs


def item_sets(con: duckdb.DuckDBPyConnection, specs: list[SampleSpec]) -> list[ItemSet]:
    """The samples ``specs`` (of :func:`sample_specs`) with their rows, grouped by item set: samples over the same
    items share one."""
    sets: dict[tuple[object, bytes], ItemSet] = {}
    for spec in specs:
        # one sample's rows at a time: at 10 M items all of them at once were 1.35 GB more at the peak
        items = {k: np.asarray(v) for k, v in con.execute(
            "select pos, value, norm, n_tokens, coalesce(zipf, 0) as zipf, d_norm from stg_analysis_values "
            f"where group_key = $key {'and zipf is not null' if spec.zipf_only else ''} order by pos",
            {"key": spec.group_key}).fetchnumpy().items()}
        set_key = (spec.set_id, items["pos"].tobytes())
        if set_key not in sets:
            sets[set_key] = _item_set(items)
        item_set = sets[set_key]
        value = items["value"][item_set.in_norm_order]
        pearson = "pearson_log_norm" in spec.statistics
        item_set.samples.append(Sample(spec.probe_set, spec.property, spec.statistics, Order.of(value),
                                        value - value.mean() if pearson else None))
        if "partial_spearman_n_tokens" in spec.statistics and item_set.tokens is None:
            item_set.tokens = Order.of(item_set.n_tokens)
        if "partial_spearman_zipf" in spec.statistics and item_set.zipf_order is None:
            item_set.zipf_order = Order.of(item_set.zipf)
    return list(sets.values())


def with_static(item_set: ItemSet) -> ItemSet:
    """``item_set`` with the fixed per-item rows of the Poisson route's weighted sums (:attr:`ItemSet.static`;
    built only for that route: 12 float64 rows per item with three properties)."""
    if item_set.static is None:
        xl = item_set.x_log_norm
        x = [s.x_value for s in item_set.samples if s.x_value is not None]
        item_set.static = np.stack([np.ones_like(xl), xl, xl * xl, *(c for v in x for c in (v, v * v, xl * v))])
    return item_set


def _item_set(items: dict[str, np.ndarray]) -> ItemSet:
    in_norm_order = np.argsort(items["d_norm"], kind="stable")
    log_norm = np.log(items["norm"][in_norm_order])
    return ItemSet(positions=items["pos"][in_norm_order].astype(np.uint32), in_norm_order=in_norm_order,
                    norm=Order.of(items["d_norm"][in_norm_order], presorted=True),
                    x_log_norm=log_norm - log_norm.mean(), n_tokens=items["n_tokens"][in_norm_order],
                    zipf=items["zipf"][in_norm_order])


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's dot product of two (rows x items) arrays."""
    return np.einsum("ij,ij->i", a, b)


def correlation(sab: np.ndarray, saa: np.ndarray, sbb: np.ndarray) -> np.ndarray:
    """Correlations from central sums of products and squares."""
    return sab / np.sqrt(saa * sbb)


def partial_correlation(r_xy: np.ndarray, r_xz: np.ndarray, r_yz: np.ndarray) -> np.ndarray:
    """r_xy given z, from the three correlations (the first-order identity of norm_vs_property.sql)."""
    return (r_xy - r_xz * r_yz) / np.sqrt((1 - r_xz * r_xz) * (1 - r_yz * r_yz))


def replicate_statistics(item_set: ItemSet, keys: np.ndarray,
                         buffers: Buffers | None = None) -> Iterator[tuple[Sample, str, np.ndarray]]:
    """(sample, statistic, its value in each replicate) for the replicates of ``keys`` (replicate_keys)."""
    buffers = Buffers() if buffers is None else buffers
    w = poisson_weights(keys, item_set.positions, buffers)
    shape = w.shape
    size = w.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        # centred ranks (their weighted sums are 0), so the weighted sums of products are central moments
        r_norm = item_set.norm.centred_ranks(w, size, buffers("r_norm", shape), buffers)
        w_norm = np.multiply(w, r_norm, out=buffers("w_norm", shape))
        snn = rowdot(w_norm, r_norm)
        w_value = buffers("w_value", shape)
        controls = {}
        for name, order in (("n_tokens", item_set.tokens), ("zipf", item_set.zipf_order)):
            if order is not None:
                r = order.centred_ranks(w, size, buffers(f"r_{name}", shape), buffers)
                scc = rowdot(np.multiply(w, r, out=w_value), r)
                controls[name] = (r, scc, correlation(rowdot(w_norm, r), snn, scc))
        # the weighted sums of fixed per-item numbers: sw, sl, sll, then per sample with a Pearson statistic
        # its sx, sxx, slx (einsum, not a BLAS product: a product's threads spin on a busy machine, measured 20x
        # slower on 2 shared cores, and its sums could depend on the chunk's shape)
        static = np.einsum("ij,kj->ik", w, item_set.static)
        sw, sl, sll = static[:, 0], static[:, 1], static[:, 2]
        at = 3
        r_value = buffers("r_value", shape)
        for sample in item_set.samples:
            sample.value.centred_ranks(w, size, r_value, buffers)
            np.multiply(w, r_value, out=w_value)
            svv = rowdot(w_value, r_value)
            r_nv = correlation(rowdot(w_norm, r_value), snn, svv)
            for statistic in sample.statistics:
                if statistic == "spearman":
                    yield sample, statistic, r_nv
                elif statistic == "pearson_log_norm":
                    sx, sxx, slx = static[:, at], static[:, at + 1], static[:, at + 2]
                    at += 3
                    yield sample, statistic, (sw * slx - sl * sx) / np.sqrt((sw * sll - sl * sl) * (sw * sxx - sx * sx))
                else:
                    r_control, scc, r_nc = controls[statistic.removeprefix("partial_spearman_")]
                    r_vc = correlation(rowdot(w_value, r_control), svv, scc)
                    yield sample, statistic, partial_correlation(r_nv, r_nc, r_vc)
