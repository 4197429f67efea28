-- report_claims: the claims table of one release as the report shows it: for every (claim, probe set, property,
-- statistic), the row of the latest run that decided it (failed runs excluded), with that run's verdict of
-- the claim. An audit of a few probe sets decides only the claims those sets speak to; another audit of the
-- same release may add the rest, each claim keeping the verdict of the run whose tests it shows.
-- params:  $model, $release
-- columns: run_id, claim, verdict, probe_set, population, analysis, property, statistic, controls, direction,
--          null_value, value, ci_low, ci_high, n, n_resamples, ci_method, p_value, p_holm, evidence
with

release_runs as (
    select run_id, status from runs where model = $model and release = $release
),

release_claims as (
    select c.*
    from claims as c
    left join release_runs as r on r.run_id = c.run_id
    where c.model = $model and c.release = $release and coalesce(r.status, '') <> 'failed'
),

latest_per_claim as (
    select claim, max(run_id) as run_id
    from release_claims
    group by all
),

final as (
    select c.* exclude (model, release)
    from release_claims as c
    inner join latest_per_claim as l on l.claim = c.claim and l.run_id = c.run_id
)

select * from final
order by
    case claim when 'specificity' then 1 when 'frequency' then 2 when 'human_uncertainty' then 3 else 4 end,
    probe_set, property, statistic
