-- paired_hypernym_units: the hypernym/hyponym pairs of hypernym_pairs.sql (same input convention), per side
-- of a paired comparison: each pair with both items embedded by that side. The unit is the pair.
-- params:  $base_model, $base_release, $other_model, $other_release, $zipf_tolerance (e.g. 0.25)
-- columns: side (0 base, 1 other), probe_set, unit ([hypernym_id, hyponym_id]), greater (1 where
--          norm(hyponym) > norm(hypernym), else 0), zipf_matched (|zipf difference| <= $zipf_tolerance)
with

sides as (
    select * from (values (0, $base_model, $base_release), (1, $other_model, $other_release))
        as t(side, model, release)
),

pairs as (
    select probe_set, left_id as hypernym_id, right_id as hyponym_id
    from probe_relations
    where relation = 'hypernym_of'
),

paired_items as (
    select probe_set, hypernym_id as item_id from pairs
    union
    select probe_set, hyponym_id from pairs
),

item_values as (
    select s.side, e.probe_set, e.item_id, e.norm, z.value as zipf
    from paired_items as i
    inner join embeddings as e on e.probe_set = i.probe_set and e.item_id = i.item_id
    inner join sides as s on s.model = e.model and s.release = e.release
    left join probe_properties as z on z.probe_set = i.probe_set and z.item_id = i.item_id and z.property = 'zipf'
),

final as (
    select
        g.side, p.probe_set, [p.hypernym_id, p.hyponym_id] as unit,
        (s.norm > g.norm)::integer as greater,
        abs(s.zipf - g.zipf) <= $zipf_tolerance as zipf_matched
    from pairs as p
    inner join item_values as g on g.probe_set = p.probe_set and g.item_id = p.hypernym_id
    inner join item_values as s on s.probe_set = p.probe_set and s.item_id = p.hyponym_id and s.side = g.side
)

select * from final
