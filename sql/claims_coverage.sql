-- claims_coverage: how much of each probe set a release embedded: the claims table names its population by it
-- (a --limit audit embeds the first N items of a set in its stable order, e.g. WordNet's most frequent nouns).
-- The release's side comes from stg_release_sets (staged for the query's model and release: pipeline/analysis/sql.py).
-- params:  none of its own (its scope is stg_release_sets')
-- columns: probe_set, n_items (in the stored set), n_embedded
with

items as (
    select probe_set, count(*) as n_items
    from probe_items
    group by all
),

embedded as (
    select probe_set, n_embedded from stg_release_sets
),

final as (
    select e.probe_set, coalesce(i.n_items, e.n_embedded) as n_items, e.n_embedded
    from embedded as e
    left join items as i on i.probe_set = e.probe_set
)

select * from final
order by probe_set
