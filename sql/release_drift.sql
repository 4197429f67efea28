-- release_drift: how every statistic of a release moved since the model's previous release.
-- The previous release is the one whose latest finished run (status 'completed' or 'alerted', as in
-- release_history.sql) started last before the first run of $release. Each release is represented by its
-- latest run that recorded the statistic (the current release's run may still be running: the report is
-- rendered at the end of the audit). intervals_overlap is null where either side has no interval.
-- params:  $model, $release
-- columns: model, release, previous_release, analysis, probe_set, property, statistic, value, ci_low,
--          ci_high, n, previous_value, previous_ci_low, previous_ci_high, previous_n, change, intervals_overlap
with

model_runs as (
    select run_id, release, started_at, status from runs where model = $model
),

current_start as (
    select min(started_at) as started_at from model_runs where release = $release
),

previous as (
    select r.release
    from model_runs as r
    cross join current_start as c
    where r.release <> $release and r.status in ('completed', 'alerted') and r.started_at < c.started_at
    order by r.started_at desc, r.run_id desc
    limit 1
),

latest_results as (
    select res.*
    from results as res
    inner join model_runs as r on r.run_id = res.run_id
    where res.model = $model and res.release in ($release, (select release from previous))
        and r.status <> 'failed'
    qualify row_number() over (
        partition by res.release, res.analysis, res.probe_set, res.property, res.statistic
        order by res.run_id desc
    ) = 1
),

current_results as (
    select * from latest_results where release = $release
),

previous_results as (
    select * from latest_results where release = (select release from previous)
),

final as (
    select
        c.model, c.release, p.release as previous_release,
        c.analysis, c.probe_set, c.property, c.statistic,
        c.value, c.ci_low, c.ci_high, c.n,
        p.value as previous_value, p.ci_low as previous_ci_low, p.ci_high as previous_ci_high, p.n as previous_n,
        c.value - p.value as change,
        case
            when c.ci_low is null or p.ci_low is null then null
            else c.ci_low <= p.ci_high and p.ci_low <= c.ci_high
        end as intervals_overlap
    from current_results as c
    inner join previous_results as p
        on p.analysis = c.analysis and p.probe_set = c.probe_set
        and p.property is not distinct from c.property and p.statistic = c.statistic
)

select * from final
order by analysis, probe_set, property, statistic
