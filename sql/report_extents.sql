-- report_extents: per probe set with a property, the range of its values and of the release's norms: the grid of
-- report_density spans them (the embedded items with the property lie within). No join of items: cheap.
-- params:  $model, $release, $property
-- columns: probe_set, x0, x1 (property), y0, y1 (norm)
with

x_extents as (
    select probe_set, min(value) as x0, max(value) as x1
    from probe_properties
    where property = $property and value is not null
    group by probe_set
),

y_extents as (
    select probe_set, min(norm) as y0, max(norm) as y1
    from embeddings
    where model = $model and release = $release
    group by probe_set
),

final as (
    select * from x_extents inner join y_extents using (probe_set)
)

select * from final
order by probe_set
