-- report_runs: the runs of one release, newest first, for the report's header.
-- params:  $model, $release
-- columns: run_id, fingerprint, probe_set, started_at, finished_at, status, code_version
with

release_runs as (
    select run_id, fingerprint, probe_set, started_at, finished_at, status, code_version
    from runs
    where model = $model and release = $release
),

final as (
    select * from release_runs
)

select * from final
order by started_at desc, run_id desc
