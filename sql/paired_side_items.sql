-- paired_side_items: the items one side of a paired comparison embedded, per probe set. pipeline/analysis/paired.py
-- stages it once per side (as paired_base_items and paired_other_items) before paired_shared_items.sql
-- intersects them: each side's read of `embeddings` (itself a join on strings) runs in a statement of its own,
-- so that each spills within NORMAUDIT_ANALYSIS_MEMORY (both in one statement: 10 M items did not fit 512MB).
-- params:  $model, $release
-- columns: probe_set, item_id
with

final as (
    select probe_set, item_id from embeddings where model = $model and release = $release
)

select * from final
