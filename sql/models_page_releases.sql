-- models_page_releases: every audited (model, release) with its latest finished run, each model's
-- releases in audit order (as in release_history.sql).
-- params:  none
-- columns: model, release, run_id, fingerprint, started_at, status
with

finished_runs as (
    select model, release, run_id, fingerprint, started_at, status
    from runs
    where status in ('completed', 'alerted')
),

latest_per_release as (
    select *, row_number() over (partition by model, release order by started_at desc, run_id desc) as recency
    from finished_runs
),

final as (
    select model, release, run_id, fingerprint, started_at, status
    from latest_per_release
    where recency = 1
)

select * from final
order by model, started_at, run_id
