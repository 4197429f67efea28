-- stg_hypernym_pairs: the direct hypernym/hyponym pairs with both items embedded by a release, with the two
-- norms compared and the zipf gap. Staged once per (model, release) (pipeline/analysis/sql.py):
-- hypernym_pairs.sql reads it, and a paired comparison's paired_hypernym_units.sql reads it per side.
-- Input convention (probe_relations, as the wordnet-pairs probe set writes it): relation = 'hypernym_of',
-- left_id = the hypernym (general) item, right_id = the hyponym (specific) item, both items of the same
-- probe set; zipf comes from probe_properties of that probe set.
-- params:  $model, $release
-- columns: probe_set, hypernym_id, hyponym_id, hyponym_greater (norm(hyponym) > norm(hypernym)),
--          zipf_gap (|zipf(hyponym) - zipf(hypernym)|, null where either lacks a zipf)
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
    select e.probe_set, e.item_id, e.norm, z.value as zipf
    from paired_items as i
    inner join embeddings as e on e.probe_set = i.probe_set and e.item_id = i.item_id
    left join probe_properties as z on z.probe_set = i.probe_set and z.item_id = i.item_id and z.property = 'zipf'
    where e.model = $model and e.release = $release
),

final as (
    select
        p.probe_set, p.hypernym_id, p.hyponym_id,
        s.norm > g.norm as hyponym_greater,
        abs(s.zipf - g.zipf) as zipf_gap
    from pairs as p
    inner join item_values as g on g.probe_set = p.probe_set and g.item_id = p.hypernym_id
    inner join item_values as s on s.probe_set = p.probe_set and s.item_id = p.hyponym_id
)

select * from final
