-- report_extents: per probe set and property of $properties it has, the range of the property's values: the
-- grid of report_density spans it and the range of the release's norms in the probe set (report_inventory's
-- min_norm and max_norm: the report reads `embeddings` once for both, each read checking every row's text hash
-- against probe_items, ~10 s at 10 M items and 256MB). The embedded items with the property lie within.
-- params:  $properties (a list of property names)
-- columns: probe_set, property, x0, x1
with

final as (
    select probe_set, property, min(value) as x0, max(value) as x1
    from probe_properties
    where list_contains($properties, property) and value is not null
    group by probe_set, property
)

select * from final
order by probe_set, property
