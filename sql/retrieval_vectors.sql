-- retrieval_vectors: the stored vectors of the queries and documents of retrieval probe sets, for the
-- exact top-k search (pipeline/analysis/retrieval.py). A retrieval probe set keeps queries and documents as items
-- of kind 'query' and 'doc'; probe sets without both kinds embedded are left out.
-- params:  $model, $release
-- columns: probe_set, kind ('query' | 'doc'), item_id, norm, vector
with

embeddings_in_scope as (
    select probe_set, item_id, norm, vector
    from embeddings
    where model = $model and release = $release
),

items as (
    select probe_set, item_id, kind from probe_items where kind in ('query', 'doc')
),

joined as (
    select e.probe_set, i.kind, e.item_id, e.norm, e.vector
    from embeddings_in_scope as e
    inner join items as i on i.probe_set = e.probe_set and i.item_id = e.item_id
),

retrieval_sets as (
    select probe_set from joined group by probe_set having count(distinct kind) = 2
),

final as (
    select j.* from joined as j where j.probe_set in (select probe_set from retrieval_sets)
)

select * from final
order by probe_set, kind, item_id
