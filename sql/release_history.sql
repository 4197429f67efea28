-- release_history: the releases of one model in the order they were audited, with the latest
-- finished run of each (the run whose results represent that release).
-- params:  $model
-- columns: release, run_id, fingerprint, started_at, status
with

finished_runs as (
    select run_id, release, fingerprint, started_at, status
    from runs
    where model = $model and status in ('completed', 'alerted')
),

latest_per_release as (
    select *, row_number() over (partition by release order by started_at desc, run_id desc) as recency
    from finished_runs
),

final as (
    select release, run_id, fingerprint, started_at, status
    from latest_per_release
    where recency = 1
)

select * from final
order by started_at, run_id
