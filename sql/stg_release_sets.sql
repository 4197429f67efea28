-- stg_release_sets: the probe sets a release embedded, with their embedded items. Read once per connection and
-- (model, release) from `embeddings`, whose every read joins the committed rows to probe_items on item id and text
-- hash (pipeline/storage/catalog.py): ~11 s at 10 M items and 256MB, paid once here instead of by each query
-- that only needs the release's probe sets or their sizes (stg_analysis_groups, claims_coverage, the claims'
-- tests). pipeline/analysis/sql.py creates it as a temporary table of this name, like stg_analysis_values.
-- params:  $model, $release
-- columns: probe_set, n_embedded
with

final as (
    select probe_set, count(*) as n_embedded
    from embeddings
    where model = $model and release = $release
    group by probe_set
)

select * from final
