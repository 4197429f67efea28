-- paired_comparison: each statistic of two (model, release) sides on the units both embedded, the difference
-- other - base, and the paired bootstrap 95% interval of that difference.
-- Inputs (temporary tables pipeline/analysis/paired.py fills before this query runs):
--   paired_points      side (0 base, 1 other), analysis, probe_set, property, statistic, value, n: each
--                      statistic on the shared units, unweighted
--   paired_replicates  side, analysis, probe_set, property, statistic, b, value: the statistic in replicate b,
--                      whose weights both sides share (the same resample of units)
--   paired_counts      analysis, probe_set, property (null: every property of the analysis on the probe set),
--                      n_only_base, n_only_other: units one side embedded alone (never resampled)
-- The interval is the 2.5% and 97.5% percentiles of the per-replicate differences (linear interpolation, as
-- numpy.quantile), over the replicates where both sides' statistic is defined (n_resamples of them).
-- verdict: 'differs' when the interval excludes 0, 'no evidence' when it contains 0, 'undefined' when there
-- is no interval (a statistic defined on one side only, or in no replicate).
-- params:  $base_model, $base_release, $other_model, $other_release
-- columns: analysis, probe_set, property, statistic, base_model, base_release, model, release, base_value,
--          value, difference, ci_low, ci_high, n_shared, n_only_base, n_only_other, n_resamples, verdict
with

points as (
    select
        analysis, probe_set, property, statistic,
        max(value) filter (where side = 0) as base_value,
        max(value) filter (where side = 1) as value,
        max(n) filter (where side = 0) as n_base,
        max(n) filter (where side = 1) as n_other
    from paired_points
    where value is not null and isfinite(value)
    group by all
),

differences as (
    select o.analysis, o.probe_set, o.property, o.statistic, o.b, o.value - s.value as difference
    from paired_replicates as o
    inner join paired_replicates as s
        on s.analysis = o.analysis and s.probe_set = o.probe_set and s.property = o.property
        and s.statistic = o.statistic and s.b = o.b
    where o.side = 1 and s.side = 0 and isfinite(o.value) and isfinite(s.value)
),

intervals as (
    select
        analysis, probe_set, property, statistic,
        quantile_cont(difference, 0.025) as ci_low,
        quantile_cont(difference, 0.975) as ci_high,
        count(*) as n_resamples
    from differences
    group by all
),

final as (
    select
        p.analysis, p.probe_set, p.property, p.statistic,
        $base_model as base_model, $base_release as base_release, $other_model as model, $other_release as release,
        p.base_value, p.value, p.value - p.base_value as difference,
        if(p.base_value is null or p.value is null, null, i.ci_low) as ci_low,
        if(p.base_value is null or p.value is null, null, i.ci_high) as ci_high,
        coalesce(least(p.n_base, p.n_other), p.n_base, p.n_other) as n_shared,
        coalesce(c.n_only_base, 0) as n_only_base,
        coalesce(c.n_only_other, 0) as n_only_other,
        if(p.base_value is null or p.value is null, 0, coalesce(i.n_resamples, 0)) as n_resamples,
        case
            when p.base_value is null or p.value is null or i.ci_low is null then 'undefined'
            when i.ci_low > 0 or i.ci_high < 0 then 'differs'
            else 'no evidence'
        end as verdict
    from points as p
    left join intervals as i
        on i.analysis = p.analysis and i.probe_set = p.probe_set and i.property = p.property
        and i.statistic = p.statistic
    left join paired_counts as c
        on c.analysis = p.analysis and c.probe_set = p.probe_set and (c.property is null or c.property = p.property)
)

select * from final
order by analysis, probe_set, property, statistic
