-- hypernym_pairs: is the more specific word's norm larger? Over direct hypernym/hyponym pairs.
-- Input convention (probe_relations, as the wordnet-pairs probe set writes it): relation = 'hypernym_of',
-- left_id = the hypernym (general) item, right_id = the hyponym (specific) item, both items of the same
-- probe set; zipf comes from probe_properties of that probe set.
-- Statistics, with a 95% Wilson score interval (as scipy.stats.binomtest(k, n).proportion_ci('wilson')):
--   share_hyponym_norm_greater               share of pairs with norm(hyponym) > norm(hypernym) (ties count
--                                            as not greater), over every pair with both items embedded
--   share_hyponym_norm_greater_zipf_matched  the same over frequency-matched pairs only:
--                                            |zipf(hyponym) - zipf(hypernym)| <= $zipf_tolerance
-- A probe set without hypernym_of relations produces no rows.
-- params:  $model, $release, $zipf_tolerance (e.g. 0.25)
-- columns: model, release, probe_set, property ('hypernym_of'), statistic, value, ci_low, ci_high, n
with

pairs as (
    select probe_set, left_id as hypernym_id, right_id as hyponym_id
    from probe_relations
    where relation = 'hypernym_of'
),

-- the items some pair names, with their norm and zipf: one join of each large table, however many pairs an
-- item is in
paired_items as (
    select probe_set, hypernym_id as item_id from pairs
    union
    select probe_set, hyponym_id from pairs
),

item_values as (
    select e.model, e.release, e.probe_set, e.item_id, e.norm, z.value as zipf
    from paired_items as i
    inner join embeddings as e on e.probe_set = i.probe_set and e.item_id = i.item_id
    left join probe_properties as z on z.probe_set = i.probe_set and z.item_id = i.item_id and z.property = 'zipf'
    where e.model = $model and e.release = $release
),

pair_norms as (
    select
        g.model, g.release, p.probe_set,
        s.norm > g.norm as hyponym_greater,
        abs(s.zipf - g.zipf) <= $zipf_tolerance as zipf_matched
    from pairs as p
    inner join item_values as g on g.probe_set = p.probe_set and g.item_id = p.hypernym_id
    inner join item_values as s on s.probe_set = p.probe_set and s.item_id = p.hyponym_id
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
