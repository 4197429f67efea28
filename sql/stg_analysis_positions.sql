-- stg_analysis_positions: stg_analysis_scope's items with their zipf and their position by item id. The second
-- of the four statements that stage stg_analysis_values (pipeline/analysis/sql.py): it reads stg_analysis_scope,
-- staged just before it for the same scope, and is dropped once stg_analysis_values is staged.
--   zipf       the item's zipf property, null where it has none
--   pos        the item's 0-based position among its probe set's embedded items ordered by item_id
-- params:  none of its own (its scope is stg_analysis_scope's)
-- columns: probe_set, item_id, norm, n_tokens, zipf, pos
with

zipf as (
    select probe_set, item_id, value as zipf from probe_properties where property = 'zipf'
),

final as (
    select
        e.*, z.zipf,
        row_number() over (partition by e.probe_set order by e.item_id) - 1 as pos
    from stg_analysis_scope as e
    left join zipf as z on z.probe_set = e.probe_set and z.item_id = e.item_id
)

select * from final
