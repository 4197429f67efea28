-- hypernym_pairs: is the more specific word's norm larger? Over direct hypernym/hyponym pairs.
-- Input: stg_hypernym_pairs (the pairs with both items embedded; its header gives the input convention).
-- Statistics, with a 95% Wilson score interval (as scipy.stats.binomtest(k, n).proportion_ci('wilson')):
--   share_hyponym_norm_greater               share of pairs with norm(hyponym) > norm(hypernym) (ties count
--                                            as not greater), over every pair with both items embedded
--   share_hyponym_norm_greater_zipf_matched  the same over frequency-matched pairs only:
--                                            |zipf(hyponym) - zipf(hypernym)| <= $zipf_tolerance
-- A probe set without hypernym_of relations produces no rows.
-- params:  $model, $release, $zipf_tolerance (e.g. 0.25)
-- columns: model, release, probe_set, property ('hypernym_of'), statistic, value, ci_low, ci_high, n
with

pair_norms as (
    select
        $model as model, $release as release, probe_set, hyponym_greater,
        zipf_gap <= $zipf_tolerance as zipf_matched
    from stg_hypernym_pairs
),

counts as (
    select model, release, probe_set, 'share_hyponym_norm_greater' as statistic,
        count_if(hyponym_greater) as k, count(*) as n
    from pair_norms
    group by all
    union all
    select model, release, probe_set, 'share_hyponym_norm_greater_zipf_matched',
        count_if(hyponym_greater), count(*)
    from pair_norms
    where zipf_matched
    group by all
),

-- Wilson score interval with z = the 97.5% standard normal quantile
wilson as (
    select
        *,
        k / n as p,
        1.959963984540054 as z,
        (p + z * z / (2 * n)) / (1 + z * z / n) as centre,
        z / (1 + z * z / n) * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) as half_width
    from counts
    where n > 0
),

final as (
    select
        model, release, probe_set, 'hypernym_of' as property, statistic,
        p as value, centre - half_width as ci_low, centre + half_width as ci_high, n
    from wilson
)

select * from final
order by probe_set, statistic
