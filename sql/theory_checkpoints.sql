-- theory_checkpoints: the norm_vs_property results of every audited release (checkpoint) of a theory-lab
-- model on the lab world's probe set, taken from the latest audit run of each release.
-- params:  $model, $probe_set
-- columns: release, run_id, probe_set, property, statistic, value, ci_low, ci_high, n
with

results_in_scope as (
    select release, run_id, probe_set, property, statistic, value, ci_low, ci_high, n
    from results
    where model = $model and probe_set = $probe_set and analysis = 'norm_vs_property'
),

latest_run as (
    select release, max(run_id) as run_id  -- run ids sort by start time
    from results_in_scope
    group by release
),

final as (
    select r.*
    from results_in_scope as r
    inner join latest_run as l using (release, run_id)
)

select * from final
order by release, property, statistic
