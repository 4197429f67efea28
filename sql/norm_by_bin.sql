-- norm_by_bin: the distribution of the norm within bins of each property.
-- Bins: a property with at most $n_bins distinct values gets one bin per value (e.g. WordNet depth);
-- otherwise $n_bins quantile bins (deciles for 10) of equal size, items ordered by (value, item_id), the
-- first (n mod $n_bins) bins one item larger (SQL ntile; numpy.array_split on the sorted items).
-- Per bin: mean, median, first and third quartile and IQR of the norm (quartiles interpolated linearly,
-- as numpy.percentile), and the bin's lowest and highest property value.
-- params:  $model, $release, $n_bins (e.g. 10)
-- columns: model, release, probe_set, property, statistic ('bin03_mean', 'bin03_median', 'bin03_q1',
--          'bin03_q3', 'bin03_iqr', 'bin03_low', 'bin03_high'; bins numbered from 1), value, n (items in bin)
with

embeddings_in_scope as (
    select probe_set, item_id, norm
    from embeddings
    where model = $model and release = $release
),

properties as (
    select probe_set, item_id, property, value from probe_properties where value is not null
),

-- group_key: one integer per (probe set, property), the window partition (faster than strings)
joined as (
    select hash(e.probe_set, p.property) as group_key, e.probe_set, p.property, e.item_id, e.norm, p.value
    from embeddings_in_scope as e
    inner join properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
),

groups as (
    select
        group_key,
        any_value(probe_set) as probe_set,
        any_value(property) as property,
        count(distinct value) <= $n_bins as one_bin_per_value
    from joined
    group by group_key
),

binned as (
    select j.group_key, j.norm, j.value, dense_rank() over (partition by j.group_key order by j.value) as bin
    from joined as j
    inner join groups as g using (group_key)
    where g.one_bin_per_value
    union all
    select
        j.group_key, j.norm, j.value,
        ntile($n_bins) over (partition by j.group_key order by j.value, j.item_id) as bin
    from joined as j
    inner join groups as g using (group_key)
    where not g.one_bin_per_value
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
