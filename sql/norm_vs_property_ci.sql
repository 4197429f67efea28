-- norm_vs_property_ci: bootstrap 95% confidence intervals for the statistics of norm_vs_property.
-- The interval is the 2.5% and 97.5% percentiles of the replicate statistics (linear interpolation, as
-- numpy.quantile); replicates where a statistic is undefined are dropped, and n_resamples says how many
-- remained. The replicates (Poisson bootstrap, seeded: pipeline/analysis/bootstrap.py defines the method and
-- computes them) come from the temporary table stg_bootstrap_replicates, which pipeline/analysis/sql.py builds
-- before this query runs, in batches of replicates.
-- params:  $model, $release; and for the replicates: resamples (e.g. 1000), seed (0 <= seed < 2^32)
-- columns: model, release, probe_set, property, statistic, ci_low, ci_high, n_resamples
with

intervals as (
    select
        probe_set, property, statistic,
        quantile_cont(value, 0.025) as ci_low,
        quantile_cont(value, 0.975) as ci_high,
        count(*) as n_resamples
    from stg_bootstrap_replicates
    where value is not null and isfinite(value)
    group by all
),

final as (
    select $model as model, $release as release, i.*
    from intervals as i
)

select * from final
order by probe_set, property, statistic
