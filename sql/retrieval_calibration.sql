-- retrieval_calibration: is the query's norm a free confidence signal for retrieval?
-- Input: retrieval_queries, the output of retrieval_per_query.sql registered on the connection (rows with
-- alpha = 0, plain cosine ranking, are used here).
-- Per retrieval probe set:
--   property 'retrieval': mean_success_at_1, mean_success_at_10, mean_ndcg_at_10 over queries, with a
--     normal-approximation 95% interval (mean +- 1.96 * sample sd / sqrt(n))
--   property 'success_at_1' / 'success_at_10': AUROC of each signal for that success (ties count 1/2, as
--     sklearn.metrics.roc_auc_score; higher signal = predicted success; 0.5 = no signal): auroc_query_norm,
--     auroc_top1_cosine, auroc_top1_margin (best minus second-best cosine), auroc_query_n_tokens (a
--     length-only baseline). Only where both outcomes occur.
--   property 'selective_accuracy_query_norm' / 'selective_accuracy_top1_cosine': the selective accuracy
--     curve, abstaining on the queries with the lowest signal: statistic 'coverage_0.1' .. 'coverage_1.0'
--     is the success@1 rate of the ceil(c * n) queries with the highest signal (ties by query_id), n = kept;
--     and 'mean_selective_accuracy', the mean of those ten points.
-- Intervals: the means carry their normal-approximation interval; the AUROC and selective-accuracy rows take
-- the query-level Poisson bootstrap's, from stg_retrieval_intervals (pipeline/analysis/retrieval_intervals.py,
-- staged by run_analysis before this query runs: probe_set, property, statistic, ci_low, ci_high,
-- n_resamples, ci_method).
-- params:  none besides the registered inputs
-- columns: probe_set, property, statistic, value, ci_low, ci_high, n, n_resamples, ci_method
with

queries as (
    select * from retrieval_queries where alpha = 0
),

means as (
    unpivot (
        select probe_set, success_at_1, success_at_10, ndcg_at_10 from queries
    )
    on success_at_1, success_at_10, ndcg_at_10
    into name measure value outcome
),

mean_rows as (
    select
        probe_set, 'retrieval' as property, 'mean_' || measure as statistic,
        avg(outcome) as value,
        avg(outcome) - 1.959963984540054 * stddev_samp(outcome) / sqrt(count(*)) as ci_low,
        avg(outcome) + 1.959963984540054 * stddev_samp(outcome) / sqrt(count(*)) as ci_high,
        count(*) as n,
        null::bigint as n_resamples,
        case when stddev_samp(outcome) is not null then 'normal approximation' end as ci_method
    from means
    group by all
),

signals as (
    unpivot (
        select
            probe_set, query_id, success_at_1, success_at_10,
            query_norm, top1_score as top1_cosine, margin as top1_margin, query_n_tokens::double as query_n_tokens
        from queries
    )
    on query_norm, top1_cosine, top1_margin, query_n_tokens
    into name signal value score
),

outcomes as (
    unpivot signals
    on success_at_1, success_at_10
    into name target value success
),

-- Mann-Whitney: AUROC = (rank sum of successes - n1 (n1 + 1) / 2) / (n1 n0), average ranks for ties
ranked as (
    select
        *,
        (rank() over w + count(*) over w) / 2.0 as r
    from outcomes
    where score is not null
    window w as (partition by probe_set, signal, target order by score)
),

auroc_rows as (
    select
        probe_set, target as property, 'auroc_' || signal as statistic,
        (sum(r) filter (where success = 1) - count_if(success = 1) * (count_if(success = 1) + 1) / 2.0)
            / (count_if(success = 1) * count_if(success = 0)) as value,
        count(*) as n
    from ranked
    group by all
    having count_if(success = 1) > 0 and count_if(success = 0) > 0
),

ordered as (
    select
        probe_set, signal, success_at_1,
        row_number() over (partition by probe_set, signal order by score desc, query_id) as position,
        count(*) over (partition by probe_set, signal) as n_queries
    from signals
    where signal in ('query_norm', 'top1_cosine')
),

coverages as (
    select c as tenths from range(1, 11) as t(c)
),

-- keep the ceil(tenths * n / 10) queries with the highest signal (integer arithmetic: no rounding drift)
selective as (
    select
        o.probe_set, 'selective_accuracy_' || o.signal as property,
        printf('coverage_%.1f', c.tenths / 10) as statistic,
        avg(o.success_at_1) as value,
        count(*) as n
    from ordered as o
    inner join coverages as c on o.position <= (c.tenths * o.n_queries + 9) // 10
    group by all
),

selective_rows as (
    select probe_set, property, statistic, value, n
    from selective
    union all
    select probe_set, property, 'mean_selective_accuracy', avg(value), max(n)
    from selective
    group by all
),

-- the AUROC and selective-accuracy rows with their bootstrap intervals
bootstrapped as (
    select
        point.probe_set, point.property, point.statistic, point.value,
        boot.ci_low, boot.ci_high, point.n, boot.n_resamples, boot.ci_method
    from (
        select probe_set, property, statistic, value, n from auroc_rows
        union all
        select * from selective_rows
    ) as point
    left join stg_retrieval_intervals as boot using (probe_set, property, statistic)
),

final as (
    select * from mean_rows
    union all
    select * from bootstrapped
)

select * from final
order by probe_set, property, statistic
