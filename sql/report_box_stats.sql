-- report_box_stats: per probe set and level of a property (e.g. WordNet depth), the box of the norm as
-- matplotlib's boxplot draws it: quartiles (linear interpolation, as numpy.percentile) and whiskers at the most
-- extreme norms within 1.5 IQR of the box (never inside it), over every item, so the report never reads the items themselves.
-- params:  $model, $release, $property
-- columns: probe_set, level, n, whislo, q1, med, q3, whishi
with

points as (
    select e.probe_set, p.value as level, e.norm
    from embeddings as e
    inner join probe_properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
    where e.model = $model and e.release = $release and p.property = $property and p.value is not null
),

quartiles as (
    select
        probe_set, level, count(*) as n,
        quantile_cont(norm, 0.25) as q1, quantile_cont(norm, 0.5) as med, quantile_cont(norm, 0.75) as q3
    from points
    group by probe_set, level
),

whiskers as (
    select
        q.probe_set, q.level,
        min(p.norm) filter (where p.norm >= q.q1 - 1.5 * (q.q3 - q.q1)) as whislo,
        max(p.norm) filter (where p.norm <= q.q3 + 1.5 * (q.q3 - q.q1)) as whishi
    from points as p
    inner join quartiles as q on q.probe_set = p.probe_set and q.level = p.level
    group by q.probe_set, q.level
),

final as (
    select
        q.probe_set, q.level, q.n,
        -- as matplotlib: a whisker never ends inside the box (no item between the box and 1.5 IQR beyond it)
        least(q.q1, coalesce(w.whislo, q.q1)) as whislo, q.q1, q.med, q.q3,
        greatest(q.q3, coalesce(w.whishi, q.q3)) as whishi
    from quartiles as q
    inner join whiskers as w on w.probe_set = q.probe_set and w.level = q.level
)

select * from final
order by probe_set, level
