-- retrieval_topk: exact top-k documents by cosine similarity for every query, computed inside DuckDB.
-- The audit runs the faster numpy search of pipeline/analysis/retrieval.py instead (benchmarks/topk_search.py
-- measures both); this query is its reference and the DuckDB side of that benchmark.
-- Ties in score are broken by doc_id.
-- params:  $model, $release, $k
-- columns: probe_set, query_id, rank (1 = best), doc_id, score (cosine)
with

embeddings_in_scope as (
    select probe_set, item_id, vector
    from embeddings
    where model = $model and release = $release
),

items as (
    select probe_set, item_id, kind from probe_items where kind in ('query', 'doc')
),

queries as (
    select e.probe_set, e.item_id as query_id, e.vector
    from embeddings_in_scope as e
    inner join items as i on i.probe_set = e.probe_set and i.item_id = e.item_id
    where i.kind = 'query'
),

docs as (
    select e.probe_set, e.item_id as doc_id, e.vector
    from embeddings_in_scope as e
    inner join items as i on i.probe_set = e.probe_set and i.item_id = e.item_id
    where i.kind = 'doc'
),

scored as (
    select q.probe_set, q.query_id, d.doc_id, list_cosine_similarity(q.vector, d.vector) as score
    from queries as q
    inner join docs as d on d.probe_set = q.probe_set
),

final as (
    select
        probe_set, query_id,
        row_number() over (partition by probe_set, query_id order by score desc, doc_id) as rank,
        doc_id, score
    from scored
    qualify rank <= $k
)

select * from final
order by probe_set, query_id, rank
