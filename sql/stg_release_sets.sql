-- stg_release_sets: the probe sets a release embedded, with their embedded items, for the queries that need only
-- the release's probe sets or their sizes (stg_analysis_groups, claims_coverage, the claims' tests). Counted from
-- stg_analysis_scope, the release's one read of `embeddings` (whose every read joins the committed rows to
-- probe_items on item id and text hash, pipeline/storage/catalog.py: ~10 s at 10 M items and 256MB), which
-- stg_analysis_values' steps read too. pipeline/analysis/sql.py creates it as a temporary table of this name,
-- like stg_analysis_values, and drops stg_analysis_scope once both are staged.
-- params:  none of its own (its scope is stg_analysis_scope's)
-- columns: probe_set, n_embedded
with

final as (
    select probe_set, count(*) as n_embedded
    from stg_analysis_scope
    group by probe_set
)

select * from final
