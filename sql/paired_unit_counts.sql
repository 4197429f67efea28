-- paired_unit_counts: per (probe set, property), how many items carrying the property each side of a paired
-- comparison embedded alone (never resampled: they are only reported). The norm_vs_property units.
-- params:  $base_model, $base_release, $other_model, $other_release
-- columns: analysis, probe_set, property, n_only_base, n_only_other
with

sides as (
    select
        probe_set, item_id,
        bool_or(model = $base_model and release = $base_release) as in_base,
        bool_or(model = $other_model and release = $other_release) as in_other
    from embeddings
    where (model = $base_model and release = $base_release) or (model = $other_model and release = $other_release)
    group by all
),

final as (
    select
        'norm_vs_property' as analysis, s.probe_set, p.property,
        count_if(s.in_base and not s.in_other) as n_only_base,
        count_if(s.in_other and not s.in_base) as n_only_other
    from sides as s
    inner join probe_properties as p on p.probe_set = s.probe_set and p.item_id = s.item_id
    where p.value is not null
    group by all
)

select * from final
