-- paired_retrieval_calibration: the tracked statistics of retrieval_calibration.sql on a weighted resample of
-- the shared queries, per side and replicate (each query appears w times, as on numpy.repeat'ed rows):
--   property 'retrieval': mean_success_at_1, mean_success_at_10, mean_ndcg_at_10 (weighted means)
--   property 'success_at_1' / 'success_at_10': auroc_query_norm, auroc_top1_cosine, auroc_top1_margin,
--     auroc_query_n_tokens (Mann-Whitney with average ranks over the resample; only where both outcomes occur)
--   property 'selective_accuracy_query_norm' / 'selective_accuracy_top1_cosine': mean_selective_accuracy,
--     the mean success@1 of the ceil(c * n) resampled queries with the highest signal (ties by query_id),
--     c = 0.1 .. 1.0, n = the resample's queries. The coverage_* points themselves are not compared (alerts
--     never track them).
-- pipeline/analysis/paired_units.py runs it once with every weight 1 (b = -1: the point values) and once per
-- batch of replicates.
-- Inputs: paired_retrieval_calibration_units (the alpha = 0 rows of retrieval_per_query.sql for each side,
--         searched over the shared items, through paired_positions.sql), paired_weights (b, pos, w)
-- params:  none besides the inputs
-- columns: side, analysis, probe_set, property, statistic, b, value, n (the resample's queries)
with

weighted as (
    select u.*, w.b, w.w
    from paired_retrieval_calibration_units as u
    inner join paired_weights as w on w.pos = u.pos
    where u.shared
),

means as (
    unpivot (select side, probe_set, b, w, success_at_1, success_at_10, ndcg_at_10 from weighted)
    on success_at_1, success_at_10, ndcg_at_10
    into name measure value outcome
),

mean_rows as (
    select side, probe_set, 'retrieval' as property, 'mean_' || measure as statistic, b,
        sum(w * outcome) / sum(w) as value, sum(w) as n
    from means
    group by all
),

expanded as (
    select * exclude (copy)
    from (
        select
            side, probe_set, b, unit as query_id, success_at_1, success_at_10,
            query_norm, top1_cosine, top1_margin, query_n_tokens, unnest(range(w)) as copy
        from weighted
    )
),

signals as (
    unpivot expanded
    on query_norm, top1_cosine, top1_margin, query_n_tokens
    into name signal value score
),

outcomes as (
    unpivot signals
    on success_at_1, success_at_10
    into name target value success
),

ranked as (
    select *, (rank() over w + count(*) over w) / 2.0 as r
    from outcomes
    where score is not null
    window w as (partition by side, probe_set, b, signal, target order by score)
),

auroc_rows as (
    select
        side, probe_set, target as property, 'auroc_' || signal as statistic, b,
        (sum(r) filter (where success = 1) - count_if(success = 1) * (count_if(success = 1) + 1) / 2.0)
            / (count_if(success = 1) * count_if(success = 0)) as value,
        count(*) as n
    from ranked
    group by all
    having count_if(success = 1) > 0 and count_if(success = 0) > 0
),

ordered as (
    select
        side, probe_set, b, signal, success_at_1,
        row_number() over (partition by side, probe_set, b, signal order by score desc, query_id) as position,
        count(*) over (partition by side, probe_set, b, signal) as n_queries
    from signals
    where signal in ('query_norm', 'top1_cosine')
),

selective as (
    select o.side, o.probe_set, o.b, o.signal, c.tenths, avg(o.success_at_1) as value, max(o.n_queries) as n
    from ordered as o
    inner join range(1, 11) as c(tenths) on o.position <= (c.tenths * o.n_queries + 9) // 10
    group by all
),

selective_rows as (
    select side, probe_set, 'selective_accuracy_' || signal as property, 'mean_selective_accuracy' as statistic,
        b, avg(value) as value, max(n) as n
    from selective
    group by all
),

final as (
    select side, 'retrieval_calibration' as analysis, probe_set, property, statistic, b, value, n from mean_rows
    union all
    select side, 'retrieval_calibration', probe_set, property, statistic, b, value, n from auroc_rows
    union all
    select side, 'retrieval_calibration', probe_set, property, statistic, b, value, n from selective_rows
)

select * from final
