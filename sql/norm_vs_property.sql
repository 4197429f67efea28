-- norm_vs_property: does the raw embedding norm track each probe property?
-- For every (model, release, probe set, property): Spearman's rho between norm and the
-- property (average ranks for ties, as scipy.stats.spearmanr), and the partial Spearman
-- controlling for word frequency: the correlation of the rank residuals of norm and of
-- the property after a linear regression of each on the rank of zipf (items with zipf only).
-- params:  $model, $release
-- columns: model, release, probe_set, property, statistic ('spearman' | 'partial_spearman_zipf'), value, n
with

embeddings_in_scope as (
    select model, release, probe_set, item_id, norm
    from embeddings
    where model = $model and release = $release
),

properties as (
    select probe_set, item_id, property, value from probe_properties
),

zipf as (
    select probe_set, item_id, value as zipf from probe_properties where property = 'zipf'
),

joined as (
    select e.model, e.release, e.probe_set, p.property, e.item_id, e.norm, p.value, z.zipf
    from embeddings_in_scope as e
    inner join properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
    left join zipf as z on z.probe_set = e.probe_set and z.item_id = e.item_id
),

-- average rank = first rank of the tie group + (size of the tie group - 1) / 2
ranked_all as (
    select
        model, release, probe_set, property,
        rank() over (partition by model, release, probe_set, property order by norm)
            + (count(*) over (partition by model, release, probe_set, property, norm) - 1) / 2.0 as r_norm,
        rank() over (partition by model, release, probe_set, property order by value)
            + (count(*) over (partition by model, release, probe_set, property, value) - 1) / 2.0 as r_value
    from joined
),

ranked_with_zipf as (
    select
        model, release, probe_set, property,
        rank() over (partition by model, release, probe_set, property order by norm)
            + (count(*) over (partition by model, release, probe_set, property, norm) - 1) / 2.0 as r_norm,
        rank() over (partition by model, release, probe_set, property order by value)
            + (count(*) over (partition by model, release, probe_set, property, value) - 1) / 2.0 as r_value,
        rank() over (partition by model, release, probe_set, property order by zipf)
            + (count(*) over (partition by model, release, probe_set, property, zipf) - 1) / 2.0 as r_zipf
    from joined
    where zipf is not null and property <> 'zipf'
),

spearman as (
    select
        model, release, probe_set, property,
        'spearman' as statistic,
        corr(r_norm, r_value) as value,
        count(*) as n
    from ranked_all
    group by all
),

residual_fits as (
    select
        model, release, probe_set, property,
        regr_slope(r_norm, r_zipf) as b_norm, regr_intercept(r_norm, r_zipf) as a_norm,
        regr_slope(r_value, r_zipf) as b_value, regr_intercept(r_value, r_zipf) as a_value
    from ranked_with_zipf
    group by all
),

residuals as (
    select
        r.model, r.release, r.probe_set, r.property,
        r.r_norm - (f.a_norm + f.b_norm * r.r_zipf) as e_norm,
        r.r_value - (f.a_value + f.b_value * r.r_zipf) as e_value
    from ranked_with_zipf as r
    inner join residual_fits as f using (model, release, probe_set, property)
),

partial_spearman as (
    select
        model, release, probe_set, property,
        'partial_spearman_zipf' as statistic,
        corr(e_norm, e_value) as value,
        count(*) as n
    from residuals
    group by all
),

final as (
    select * from spearman
    union all
    select * from partial_spearman
)

select * from final
order by probe_set, property, statistic
