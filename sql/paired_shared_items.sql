-- paired_shared_items: the items two releases both embedded, per probe set: the units a paired comparison
-- (pipeline/analysis/paired.py) resamples. An item embedded by one side only is left out here and only counted
-- (paired_unit_counts.sql).
-- params:  $base_model, $base_release, $other_model, $other_release
-- columns: probe_set, item_id
with

base_items as (
    select probe_set, item_id from embeddings where model = $base_model and release = $base_release
),

other_items as (
    select probe_set, item_id from embeddings where model = $other_model and release = $other_release
),

final as (
    select probe_set, item_id from base_items
    intersect
    select probe_set, item_id from other_items
)

select * from final
