-- report_points: one point per embedded item of a probe set for a plot of norm against a property (the report
-- draws sets of more items from report_density).
-- params:  $model, $release, $property, $probe_set
-- columns: probe_set, item_id, norm, value
with

embeddings_in_scope as (
    select probe_set, item_id, norm from embeddings
    where model = $model and release = $release and probe_set = $probe_set
),

property_values as (
    select probe_set, item_id, value from probe_properties
    where property = $property and probe_set = $probe_set and value is not null
),

final as (
    select e.probe_set, e.item_id, e.norm, p.value
    from embeddings_in_scope as e
    inner join property_values as p on p.probe_set = e.probe_set and p.item_id = e.item_id
)

select * from final
order by probe_set, item_id
