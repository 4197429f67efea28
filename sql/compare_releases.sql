-- compare_releases: every statistic of one run beside the same statistic of a previous run.
-- params:  $current_run, $previous_run
-- columns: analysis, probe_set, property, statistic, previous_value, value, change, previous_n, n,
--          previous_ci_low, previous_ci_high, ci_low, ci_high (each release's own 95% interval, null where none)
with

current_results as (
    select * from results where run_id = $current_run
),

previous_results as (
    select * from results where run_id = $previous_run
),

final as (
    select
        c.analysis, c.probe_set, c.property, c.statistic,
        p.value as previous_value,
        c.value,
        c.value - p.value as change,
        p.n as previous_n,
        c.n,
        p.ci_low as previous_ci_low,
        p.ci_high as previous_ci_high,
        c.ci_low,
        c.ci_high
    from current_results as c
    inner join previous_results as p
        on c.analysis = p.analysis
        and c.probe_set = p.probe_set
        and c.property is not distinct from p.property
        and c.statistic = p.statistic
    where c.value is not null and p.value is not null
)

select * from final
order by analysis, probe_set, property, statistic
