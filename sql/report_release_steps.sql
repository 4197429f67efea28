-- report_release_steps: each release of a model against the release audited before it, as the paired
-- comparison stored them (every audit of a release compares it with the previous one), for the model's
-- cross-release page. Where a pair was compared more than once, the latest comparison counts.
-- params:  $model
-- columns: base_release, release, analysis, probe_set, property, statistic, base_value, value, difference,
--          ci_low, ci_high, n_shared, verdict
with

steps as (
    select *
    from comparisons
    where base_model = $model and model = $model and base_release <> release
    qualify row_number() over (
        partition by base_release, release, analysis, probe_set, property, statistic order by run_id desc
    ) = 1
),

final as (
    select
        base_release, release, analysis, probe_set, property, statistic,
        base_value, value, difference, ci_low, ci_high, n_shared, verdict
    from steps
)

select * from final
order by base_release, release, verdict, abs(difference) desc, analysis, probe_set, property, statistic
