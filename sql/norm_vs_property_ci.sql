-- norm_vs_property_ci: bootstrap 95% confidence intervals for the statistics of norm_vs_property.
-- The interval is the 2.5% and 97.5% percentiles of the replicate statistics (linear interpolation, as
-- numpy.quantile); replicates where a statistic is undefined are dropped, and n_resamples says how many
-- remained. The replicates (seeded: pipeline/analysis/bootstrap.py defines the methods and computes them) come
-- from the temporary table stg_bootstrap_replicates, which pipeline/analysis/sql.py builds before this query
-- runs, in batches of replicates. ci_method names the method: 'poisson bootstrap', or for a sample of more
-- than bootstrap_switch_n items 'm-out-of-n bootstrap m=<draws>', whose replicate values are already
-- rescaled (full-sample value + sqrt(m/n) x deviation), so the same percentiles give its interval.
-- params:  $model, $release; and for the replicates: resamples (e.g. 1000), seed (0 <= seed < 2^32),
--          bootstrap_switch_n (e.g. 250000), bootstrap_m (e.g. 65536)
-- columns: model, release, probe_set, property, statistic, ci_low, ci_high, n_resamples, ci_method
with

intervals as (
    select
        probe_set, property, statistic,
        quantile_cont(value, 0.025) as ci_low,
        quantile_cont(value, 0.975) as ci_high,
        count(*) as n_resamples,
        any_value(method) as ci_method
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
