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
    select model, release, probe_set, item_id, norm
    from embeddings
    where model = $model and release = $release
),

properties as (
    select probe_set, item_id, property, value from probe_properties where value is not null
),

joined as (
    select e.model, e.release, e.probe_set, p.property, e.item_id, e.norm, p.value
    from embeddings_in_scope as e
    inner join properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
),

distinct_values as (
    select model, release, probe_set, property, count(distinct value) as n_values
    from joined
    group by all
),

binned as (
    select
        j.*,
        case
            when d.n_values <= $n_bins
                then dense_rank() over (partition by j.model, j.release, j.probe_set, j.property order by j.value)
            else ntile($n_bins) over (partition by j.model, j.release, j.probe_set, j.property
                                      order by j.value, j.item_id)
        end as bin
    from joined as j
    inner join distinct_values as d using (model, release, probe_set, property)
),

per_bin as (
    select
        model, release, probe_set, property, bin,
        count(*) as n,
        avg(norm) as mean,
        quantile_cont(norm, 0.5) as median,
        quantile_cont(norm, 0.25) as q1,
        quantile_cont(norm, 0.75) as q3,
        quantile_cont(norm, 0.75) - quantile_cont(norm, 0.25) as iqr,
        min(value) as low,
        max(value) as high
    from binned
    group by all
),

long as (
    unpivot per_bin
    on mean, median, q1, q3, iqr, low, high
    into name stat value value
),

final as (
    select
        model, release, probe_set, property,
        printf('bin%02d_%s', bin, stat) as statistic,
        value, n
    from long
)

select * from final
order by probe_set, property, statistic
