-- norm_by_bin: the distribution of the norm within bins of each property.
-- Bins: a property with at most $n_bins distinct values gets one bin per value (e.g. WordNet depth);
-- otherwise $n_bins quantile bins (deciles for 10) of equal size, items ordered by (value, item_id), the
-- first (n mod $n_bins) bins one item larger (as SQL ntile; numpy.array_split on the sorted items).
-- Per bin: mean, median, first and third quartile and IQR of the norm (quartiles interpolated linearly,
-- as numpy.percentile), and the bin's lowest and highest property value.
-- params:  $model, $release, $n_bins (e.g. 10)
-- columns: model, release, probe_set, property, statistic ('bin03_mean', 'bin03_median', 'bin03_q1',
--          'bin03_q3', 'bin03_iqr', 'bin03_low', 'bin03_high'; bins numbered from 1), value, n (items in bin)
with

-- group_key: one integer per (probe set, property), the window partition (faster than strings); pos orders
-- a probe set's items by item_id (an integer sort key instead of the string)
joined as (
    select group_key, probe_set, property, pos, norm, value from stg_analysis_values
),

-- which binning each (probe set, property) gets. Exact distinct counts are costly over millions of rows:
-- a HyperLogLog estimate settles the clear cases, and the exact count runs only where the estimate is
-- small (HyperLogLog is exact in practice at these sizes; the exact count decides)
group_sizes as (
    select
        group_key, any_value(probe_set) as probe_set, any_value(property) as property, count(*) as n,
        approx_count_distinct(value) as approx_values
    from joined
    group by group_key
),

exact_values as (
    select group_key, count(distinct value) as n_values
    from joined
    where group_key in (select group_key from group_sizes where approx_values <= 4 * $n_bins)
    group by group_key
),

groups as (
    select
        s.group_key, s.probe_set, s.property, s.n,
        coalesce(e.n_values, s.approx_values) <= $n_bins as one_bin_per_value,
        -- ties are common (zipf has two decimals): bin by counting values rather than sorting rows
        s.approx_values * 8 <= s.n as few_values,
        s.n // $n_bins as q,
        s.n % $n_bins as r
    from group_sizes as s
    left join exact_values as e using (group_key)
),

-- one bin per value: the value's dense rank among the group's (at most $n_bins) values
value_bins as (
    select group_key, value, dense_rank() over (partition by group_key order by value) as bin
    from (select distinct group_key, value from joined where group_key in (
        select group_key from groups where one_bin_per_value
    ))
),

-- quantile bins (ntile): with n = q * $n_bins + r rows in (value, pos) order, the first r bins hold q + 1
-- rows and the rest q; the row at 0-based position k is in bin k // (q + 1) + 1 if k < r * (q + 1), else
-- in bin r + (k - r * (q + 1)) // q + 1. Few distinct values: a value's rows hold positions start ..
-- start + c - 1; only a value whose rows straddle a bin boundary needs its rows ordered by pos
value_spans as (
    select
        v.group_key, v.value, v.c,
        sum(v.c) over (partition by v.group_key order by v.value rows between unbounded preceding and current row)
            - v.c as start
    from (
        select group_key, value, count(*) as c
        from joined
        where group_key in (select group_key from groups where not one_bin_per_value and few_values)
        group by group_key, value
    ) as v
),

span_bins as (
    select
        s.group_key, s.value, s.start, g.q, g.r,
        case when s.start < g.r * (g.q + 1) then s.start // (g.q + 1) + 1
            else g.r + (s.start - g.r * (g.q + 1)) // g.q + 1 end as first_bin,
        case when s.start + s.c - 1 < g.r * (g.q + 1) then (s.start + s.c - 1) // (g.q + 1) + 1
            else g.r + (s.start + s.c - 1 - g.r * (g.q + 1)) // g.q + 1 end as last_bin
    from value_spans as s
    inner join groups as g using (group_key)
),

binned as (
    -- one bin per value
    select j.group_key, j.norm, j.value, b.bin
    from joined as j
    inner join value_bins as b on b.group_key = j.group_key and b.value = j.value
    union all
    -- quantile bins, values whose rows share one bin
    select j.group_key, j.norm, j.value, b.first_bin
    from joined as j
    inner join span_bins as b on b.group_key = j.group_key and b.value = j.value
    where b.first_bin = b.last_bin
    union all
    -- quantile bins, values whose rows straddle a boundary: positions by pos within the value
    select group_key, norm, value,
        case when k < r * (q + 1) then k // (q + 1) + 1 else r + (k - r * (q + 1)) // q + 1 end
    from (
        select
            j.group_key, j.norm, j.value, b.q, b.r,
            b.start + row_number() over (partition by j.group_key, j.value order by j.pos) - 1 as k
        from joined as j
        inner join span_bins as b on b.group_key = j.group_key and b.value = j.value
        where b.first_bin <> b.last_bin
    )
    union all
    -- quantile bins, many distinct values: sort the rows
    select j.group_key, j.norm, j.value, ntile($n_bins) over (partition by j.group_key order by j.value, j.pos)
    from joined as j
    where j.group_key in (select group_key from groups where not one_bin_per_value and not few_values)
),

per_bin as (
    select
        group_key, bin,
        count(*) as n,
        avg(norm) as mean,
        quantile_cont(norm, 0.5) as median,
        quantile_cont(norm, 0.25) as q1,
        quantile_cont(norm, 0.75) as q3,
        quantile_cont(norm, 0.75) - quantile_cont(norm, 0.25) as iqr,
        min(value) as low,
        max(value) as high
    from binned
    group by group_key, bin
),

long as (
    unpivot per_bin
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
