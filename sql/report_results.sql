-- report_results: the statistics of one release as the report shows them: for every
-- (analysis, probe set, property, statistic), the row of the latest run that recorded it (runs that
-- failed excluded; the current run may still be running when the audit renders its report).
-- params:  $model, $release
-- columns: run_id, analysis, model, release, probe_set, property, statistic, value, ci_low, ci_high, n
with

release_runs as (
    select run_id, status from runs where model = $model and release = $release
),

release_results as (
    select res.*
    from results as res
    left join release_runs as r on r.run_id = res.run_id
    where res.model = $model and res.release = $release and coalesce(r.status, '') <> 'failed'
),

final as (
    select *
    from release_results
    qualify row_number() over (partition by analysis, probe_set, property, statistic order by run_id desc) = 1
)

select * from final
order by analysis, probe_set, property, statistic
