-- retrieval_per_query: per query and scoring rule, how well the top 10 retrieved documents answer it.
-- Input: retrieval_rankings (probe_set, alpha, query_id, rank, doc_id, score), the exact top-10 search of
-- pipeline/analysis/retrieval.py registered on the connection: alpha = 0 ranks by cosine, alpha = a by
-- cosine * ||doc||^a; qrels from probe_relations (relation 'relevant', left_id = query, right_id = doc,
-- value = graded relevance, > 0 relevant). Only judged documents that are in the searched corpus count, and
-- only queries with at least one such relevant document are scored.
--   success_at_1 / success_at_10  1 if a relevant document is ranked first / in the top 10, else 0
--   ndcg_at_10   DCG@10 / ideal DCG@10 with linear gain, DCG = sum(relevance / log2(rank + 1)) (trec_eval)
--   top1_score   the best document's score; margin: best minus second-best score
-- params:  $model, $release
-- columns: probe_set, alpha, query_id, query_norm, query_n_tokens, n_relevant, top1_score, margin,
--          success_at_1, success_at_10, ndcg_at_10
with

rankings as (
    select probe_set, alpha, query_id, rank, doc_id, score from retrieval_rankings where rank <= 10
),

embeddings_in_scope as (
    select probe_set, item_id, norm, n_tokens
    from embeddings
    where model = $model and release = $release
),

corpus as (
    select e.probe_set, e.item_id as doc_id
    from embeddings_in_scope as e
    inner join probe_items as i on i.probe_set = e.probe_set and i.item_id = e.item_id
    where i.kind = 'doc'
),

qrels as (
    select r.probe_set, r.left_id as query_id, r.right_id as doc_id, r.value as relevance
    from probe_relations as r
    inner join corpus as c on c.probe_set = r.probe_set and c.doc_id = r.right_id
    where r.relation = 'relevant' and r.value > 0
),

queries as (
    select e.probe_set, e.item_id as query_id, e.norm as query_norm, e.n_tokens as query_n_tokens
    from embeddings_in_scope as e
    inner join (select distinct probe_set, query_id from qrels) as q
        on q.probe_set = e.probe_set and q.query_id = e.item_id
),

qrels_ranked as (
    select *, row_number() over (partition by probe_set, query_id order by relevance desc) as position
    from qrels
),

ideal as (
    select
        probe_set, query_id,
        count(*) as n_relevant,
        sum(relevance / log2(position + 1)) filter (where position <= 10) as idcg
    from qrels_ranked
    group by all
),

judged as (
    select r.*, coalesce(q.relevance, 0) as relevance
    from rankings as r
    left join qrels as q on q.probe_set = r.probe_set and q.query_id = r.query_id and q.doc_id = r.doc_id
),

per_query as (
    select
        probe_set, alpha, query_id,
        max(score) filter (where rank = 1) as top1_score,
        max(score) filter (where rank = 1) - max(score) filter (where rank = 2) as margin,
        max(case when rank = 1 and relevance > 0 then 1 else 0 end) as success_at_1,
        max(case when relevance > 0 then 1 else 0 end) as success_at_10,
        sum(relevance / log2(rank + 1)) as dcg
    from judged
    group by all
),

final as (
    select
        p.probe_set, p.alpha, p.query_id, q.query_norm, q.query_n_tokens, i.n_relevant,
        p.top1_score, p.margin, p.success_at_1, p.success_at_10,
        p.dcg / i.idcg as ndcg_at_10
    from per_query as p
    inner join queries as q on q.probe_set = p.probe_set and q.query_id = p.query_id
    inner join ideal as i on i.probe_set = p.probe_set and i.query_id = p.query_id
)

select * from final
order by probe_set, alpha, query_id
