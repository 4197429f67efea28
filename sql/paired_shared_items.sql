-- paired_shared_items: the items two releases both embedded, per probe set: the units a paired comparison
-- (pipeline/analysis/paired.py) resamples. An item embedded by one side only is left out here and only counted
-- (paired_unit_counts.sql). It reads each side's items (paired_side_items.sql), staged just before it as
-- paired_base_items and paired_other_items.
-- params:  none
-- columns: probe_set, item_id
with

final as (
    select probe_set, item_id from paired_base_items
    intersect
    select probe_set, item_id from paired_other_items
)

select * from final
