-- paired_hypernym_units: one side's hypernym/hyponym pairs with both items embedded (stg_hypernym_pairs.sql,
-- staged for that side's model and release: the pairs of hypernym_pairs.sql), as units of a paired comparison.
-- The unit is the pair.
-- params:  $side (0 base, 1 other), $zipf_tolerance (e.g. 0.25)
-- columns: side, probe_set, unit ([hypernym_id, hyponym_id]), greater (1 where norm(hyponym) > norm(hypernym),
--          else 0), zipf_matched (|zipf difference| <= $zipf_tolerance)
with

final as (
    select
        $side as side, probe_set, [hypernym_id, hyponym_id] as unit, hyponym_greater::integer as greater,
        zipf_gap <= $zipf_tolerance as zipf_matched
    from stg_hypernym_pairs
)

select * from final
