-- norm_by_bin: the distribution of the norm within bins of each property.
-- Bins: a property with at most $n_bins distinct values gets one bin per value (e.g. WordNet depth);
-- otherwise $n_bins quantile bins (deciles for 10) of equal size, items ordered by (value, item_id), the
-- first (n mod $n_bins) bins one item larger (as SQL ntile; numpy.array_split on the sorted items).
-- Per bin: mean, median, first and third quartile and IQR of the norm (quartiles interpolated linearly,
-- as numpy.percentile), and the bin's lowest and highest property value.
-- Binning needs no sort: stg_analysis_values places each value's rows among the group's rows in value order
-- (value_start, value_count); only the rows of a value that straddles a bin boundary are ordered by pos.
-- params:  $model, $release, $n_bins (e.g. 10)
-- columns: model, release, probe_set, property, statistic ('bin03_mean', 'bin03_median', 'bin03_q1',
--          'bin03_q3', 'bin03_iqr', 'bin03_low', 'bin03_high'; bins numbered from 1), value, n (items in bin)
with

-- one row per (probe set, property); the number of distinct values is one more than the largest dense rank
groups as (
    select
        v.group_key, g.probe_set, g.property, v.n, v.n_values <= $n_bins as one_bin_per_value,
        v.n // $n_bins as q, v.n % $n_bins as r
    from (
        select group_key, count(*) as n, max(d_value) + 1 as n_values from stg_analysis_values group by group_key
    ) as v
    inner join stg_analysis_groups as g using (group_key)
),

-- quantile bins (ntile): with n = q * $n_bins + r rows in (value, pos) order, the first r bins hold q + 1
-- rows and the rest q; the row at 0-based position k is in bin k // (q + 1) + 1 if k < r * (q + 1), else
-- in bin r + (k - r * (q + 1)) // q + 1, which is greatest(k // (q + 1), (k - r) // q) + 1 (no branch: the
-- wrong term is never the larger; q = 0 only where there are fewer rows than bins, hence one bin per
-- value). A value's rows hold positions value_start .. value_start + value_count - 1: only a value whose
-- rows straddle a bin boundary needs its rows ordered by pos
spans as not materialized (
    select
        j.group_key, j.norm, j.value, j.pos, j.value_start, g.q, g.r,
        if(g.one_bin_per_value, j.d_value, greatest(j.value_start // (g.q + 1), (j.value_start - g.r) // nullif(g.q, 0))) + 1 as first_bin,
        if(g.one_bin_per_value, j.d_value, greatest((j.value_start + j.value_count - 1) // (g.q + 1), (j.value_start + j.value_count - 1 - g.r) // nullif(g.q, 0))) + 1 as last_bin
    from stg_analysis_values as j
    inner join groups as g using (group_key)
),

binned as (
    select group_key, norm, value, first_bin as bin
    from spans
    where first_bin = last_bin
    union all
    select group_key, norm, value,
        greatest(k // (q + 1), (k - r) // nullif(q, 0)) + 1
    from (
        select group_key, norm, value, q, r,
            value_start + row_number() over (partition by group_key, value order by pos) - 1 as k
        from spans
        where first_bin <> last_bin
    )
),

per_bin as (
    select
        group_key, bin,
        count(*) as n,
        avg(norm) as mean,
        quantile_cont(norm, [0.25, 0.5, 0.75]) as qs,
        min(value) as low,
        max(value) as high
    from binned
    group by group_key, bin
),

per_bin_q as (
    select group_key, bin, n, mean, qs[2] as median, qs[1] as q1, qs[3] as q3, qs[3] - qs[1] as iqr, low, high
    from per_bin
),

long as (
    unpivot per_bin_q
    on mean, median, q1, q3, iqr, low, high
    into name stat value value
),

final as (
    select
        $model as model, $release as release, g.probe_set, g.property,
        printf('bin%02d_%s', l.bin, l.stat) as statistic,
        l.value, l.n
    from long as l
    inner join groups as g using (group_key)
)

select * from final
order by probe_set, property, statistic
