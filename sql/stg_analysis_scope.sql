-- stg_analysis_scope: the release's embedded items with their norm and token count, read once from `embeddings`
-- (for a paired comparison: the items both sides embedded). The first of the four statements that stage
-- stg_analysis_values (pipeline/analysis/sql.py: each step is staged just before the next, which reads it, and
-- all are dropped once stg_analysis_values is staged; this one once stg_release_sets, which counts its items by
-- probe set, is staged too, from the same read). Each join on strings and each window over a whole probe
-- set runs in a statement of its own, so that each spills within NORMAUDIT_ANALYSIS_MEMORY: at 256MB, 10 M items
-- did not fit in one statement, nor a paired comparison of 1 M with the view's joins and the zipf join in one.
-- params:  $model, $release
-- columns: probe_set, item_id, norm, n_tokens
with

final as (
    select probe_set, item_id, norm, n_tokens
    from embeddings
    where model = $model and release = $release
)

select * from final
