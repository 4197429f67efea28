-- stg_analysis_positions: one row per embedded item of the release, with its zipf and its position by item id.
-- The first of the three statements that stage stg_analysis_values (pipeline/analysis/sql.py: staged just before
-- stg_analysis_items, which reads it, and dropped once stg_analysis_values is staged). The joins on strings and
-- each window over a whole probe set run in statements of their own so that each spills within
-- NORMAUDIT_ANALYSIS_MEMORY: joined in one statement with the ranking of norms, 1 M items did not fit 256MB.
--   pos        the item's 0-based position among its probe set's embedded items ordered by item_id
--   zipf       the item's zipf property, null where it has none
-- params:  $model, $release
-- columns: probe_set, item_id, norm, n_tokens, zipf, pos
with

zipf as (
    select probe_set, item_id, value as zipf from probe_properties where property = 'zipf'
),

final as (
    select
        e.probe_set, e.item_id, e.norm, e.n_tokens, z.zipf,
        row_number() over (partition by e.probe_set order by e.item_id) - 1 as pos
    from embeddings as e
    left join zipf as z on z.probe_set = e.probe_set and z.item_id = e.item_id
    where e.model = $model and e.release = $release
)

select * from final
