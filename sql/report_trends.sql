-- report_trends: every statistic of a model across its releases, for the cross-release index page.
-- Releases are ordered by the start of their first run; each release is represented by the latest run
-- that recorded the statistic (failed runs excluded). Per-bin and per-coverage points of curves
-- (norm_by_bin, the selective accuracy curve) are left out: the trend page shows one line per statistic.
-- params:  $model
-- columns: release, release_order, first_started_at, analysis, probe_set, property, statistic, value,
--          ci_low, ci_high, n
with

model_runs as (
    select run_id, release, started_at, status from runs where model = $model
),

releases as (
    select
        release,
        min(started_at) as first_started_at,
        row_number() over (order by min(started_at), release) as release_order
    from model_runs
    group by release
),

latest as (
    select res.*
    from results as res
    inner join model_runs as r on r.run_id = res.run_id
    where res.model = $model and r.status <> 'failed'
        and res.analysis <> 'norm_by_bin' and res.statistic not like 'coverage_%'
    qualify row_number() over (
        partition by res.release, res.analysis, res.probe_set, res.property, res.statistic
        order by res.run_id desc
    ) = 1
),

final as (
    select
        l.release, r.release_order, r.first_started_at,
        l.analysis, l.probe_set, l.property, l.statistic, l.value, l.ci_low, l.ci_high, l.n
    from latest as l
    inner join releases as r using (release)
)

select * from final
order by analysis, statistic, probe_set, property, release_order
