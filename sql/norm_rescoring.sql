-- norm_rescoring: does weighting documents by their norm help retrieval? nDCG@10 when documents are
-- scored by cos(q, d) * ||d||^alpha, for each alpha of the search grid, against plain cosine (alpha = 0).
-- Input: retrieval_queries, the output of retrieval_per_query.sql registered on the connection.
-- Per retrieval probe set and alpha (property 'alpha=+0.50'):
--   mean_ndcg_at_10              mean nDCG@10 over queries, normal-approximation 95% interval
--   delta_ndcg_at_10_vs_cosine   mean per-query difference from alpha = 0 (paired), with its interval
-- params:  none besides the registered input
-- columns: probe_set, property, statistic, value, ci_low, ci_high, n
with

queries as (
    select probe_set, alpha, query_id, ndcg_at_10 from retrieval_queries
),

paired as (
    select q.probe_set, q.alpha, q.query_id, q.ndcg_at_10, q.ndcg_at_10 - c.ndcg_at_10 as delta
    from queries as q
    inner join queries as c on c.probe_set = q.probe_set and c.query_id = q.query_id and c.alpha = 0
),

long as (
    unpivot paired
    on ndcg_at_10, delta
    into name measure value outcome
),

final as (
    select
        probe_set,
        printf('alpha=%+.2f', alpha) as property,
        case measure when 'ndcg_at_10' then 'mean_ndcg_at_10' else 'delta_ndcg_at_10_vs_cosine' end as statistic,
        avg(outcome) as value,
        avg(outcome) - 1.959963984540054 * stddev_samp(outcome) / sqrt(count(*)) as ci_low,
        avg(outcome) + 1.959963984540054 * stddev_samp(outcome) / sqrt(count(*)) as ci_high,
        count(*) as n
    from long
    where not (measure = 'delta' and alpha = 0)
    group by all
)

select * from final
order by probe_set, property, statistic
