-- norm_vs_property: does the raw embedding norm track each probe property?
-- For every (model, release, probe set, property), over the items that have an embedding and the property:
--   spearman                   Spearman's rho between norm and the property (average ranks for ties, as
--                              scipy.stats.spearmanr)
--   pearson_log_norm           Pearson's r between ln(norm) and the property
--   partial_spearman_zipf      Spearman's rho with word frequency partialled out: the Pearson correlation of
--                              the residuals of rank(norm) and rank(property) after a least-squares fit of
--                              each on rank(zipf), ranks taken over the items that have a zipf; not reported
--                              for zipf itself
--   partial_spearman_n_tokens  the same with the tokenized length (embeddings.n_tokens) partialled out;
--                              reported only where n_tokens varies
-- The residual correlation is computed with the first-order partial correlation identity
-- (r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2)), which equals it exactly for least squares with an
-- intercept. Undefined statistics (a constant property, a constant control) produce no row.
-- params:  $model, $release
-- columns: model, release, probe_set, property, statistic, value, n
with

embeddings_in_scope as (
    select model, release, probe_set, item_id, norm, n_tokens
    from embeddings
    where model = $model and release = $release
),

properties as (
    select probe_set, item_id, property, value from probe_properties where value is not null
),

zipf as (
    select probe_set, item_id, value as zipf from probe_properties where property = 'zipf'
),

joined as (
    select e.model, e.release, e.probe_set, p.property, e.item_id, e.norm, e.n_tokens, p.value, z.zipf
    from embeddings_in_scope as e
    inner join properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
    left join zipf as z on z.probe_set = e.probe_set and z.item_id = e.item_id
),

-- average rank = (rank() + rows up to and including the tie group) / 2; both share one sort per window
ranked_all as (
    select
        model, release, probe_set, property, norm, value,
        (rank() over w_norm + count(*) over w_norm) / 2.0 as r_norm,
        (rank() over w_value + count(*) over w_value) / 2.0 as r_value,
        (rank() over w_tokens + count(*) over w_tokens) / 2.0 as r_tokens
    from joined
    window
        w_norm as (partition by model, release, probe_set, property order by norm),
        w_value as (partition by model, release, probe_set, property order by value),
        w_tokens as (partition by model, release, probe_set, property order by n_tokens)
),

-- ranks for the frequency control are taken over the items that have a zipf
ranked_with_zipf as (
    select
        model, release, probe_set, property,
        (rank() over w_norm + count(*) over w_norm) / 2.0 as r_norm,
        (rank() over w_value + count(*) over w_value) / 2.0 as r_value,
        (rank() over w_zipf + count(*) over w_zipf) / 2.0 as r_zipf
    from joined
    where zipf is not null and property <> 'zipf'
    window
        w_norm as (partition by model, release, probe_set, property order by norm),
        w_value as (partition by model, release, probe_set, property order by value),
        w_zipf as (partition by model, release, probe_set, property order by zipf)
),

correlations_all as (
    select
        model, release, probe_set, property,
        corr(r_norm, r_value) as r_xy,
        corr(r_norm, r_tokens) as r_xz,
        corr(r_value, r_tokens) as r_yz,
        corr(ln(norm), value) as pearson_log_norm,
        var_pop(r_tokens) as var_tokens,
        count(*) as n
    from ranked_all
    group by all
),

correlations_with_zipf as (
    select
        model, release, probe_set, property,
        corr(r_norm, r_value) as r_xy,
        corr(r_norm, r_zipf) as r_xz,
        corr(r_value, r_zipf) as r_yz,
        count(*) as n
    from ranked_with_zipf
    group by all
),

statistics as (
    select model, release, probe_set, property, 'spearman' as statistic, r_xy as value, n
    from correlations_all
    union all
    select model, release, probe_set, property, 'pearson_log_norm', pearson_log_norm, n
    from correlations_all
    union all
    select
        model, release, probe_set, property, 'partial_spearman_n_tokens',
        (r_xy - r_xz * r_yz) / sqrt((1 - r_xz * r_xz) * (1 - r_yz * r_yz)), n
    from correlations_all
    where var_tokens > 0
    union all
    select
        model, release, probe_set, property, 'partial_spearman_zipf',
        (r_xy - r_xz * r_yz) / sqrt((1 - r_xz * r_xz) * (1 - r_yz * r_yz)), n
    from correlations_with_zipf
),

final as (
    select * from statistics
    where value is not null and isfinite(value)
)

select * from final
order by probe_set, property, statistic
