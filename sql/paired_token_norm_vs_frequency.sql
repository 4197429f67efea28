-- paired_token_norm_vs_frequency: the statistics of token_norm_vs_frequency.sql on a weighted resample of the
-- shared words, per side and replicate: each matched token appears w times, w its word's weight, and
-- spearman (token norm vs zipf, average ranks over the resample) and pearson_log_norm (ln norm vs zipf) are
-- computed on those rows, as on numpy.repeat'ed data. pipeline/analysis/paired_units.py runs it once with
-- every weight 1 (b = -1: the point values) and once per batch of replicates.
-- Inputs: paired_token_norm_vs_frequency_units (paired_token_units.sql through paired_positions.sql),
--         paired_weights (b, pos, w)
-- params:  none besides the inputs
-- columns: side, analysis, probe_set, property, statistic, b, value, n (the resample's rows)
with

expanded as (
    select side, probe_set, b, norm, zipf
    from (
        select u.side, u.probe_set, u.norm, u.zipf, w.b, unnest(range(w.w)) as copy
        from paired_token_norm_vs_frequency_units as u
        inner join paired_weights as w on w.pos = u.pos
        where u.shared
    )
),

ranked as (
    select
        *,
        (rank() over w_norm + count(*) over w_norm) / 2.0 as r_norm,
        (rank() over w_zipf + count(*) over w_zipf) / 2.0 as r_zipf
    from expanded
    window
        w_norm as (partition by side, probe_set, b order by norm),
        w_zipf as (partition by side, probe_set, b order by zipf)
),

final as (
    select side, 'token_norm_vs_frequency' as analysis, probe_set, 'zipf' as property, 'spearman' as statistic,
        b, corr(r_norm, r_zipf) as value, count(*) as n
    from ranked
    group by all
    union all
    select side, 'token_norm_vs_frequency', probe_set, 'zipf', 'pearson_log_norm', b, corr(ln(norm), zipf),
        count(*)
    from expanded
    group by all
)

select * from final
