-- claims_pairs: the frequency-matched hypernym/hyponym pairs of one probe set, each with whether the hyponym
-- (specific) item has the larger norm: the units of the claims table's hypernym test, whose paired difference
-- between two releases pipeline/analysis/claims.py bootstraps over them.
-- Input: stg_hypernym_pairs (staged for $model, $release; its header gives the pairing convention).
-- params:  $model, $release, $probe_set, $zipf_tolerance (e.g. 0.25)
-- columns: model, release, hypernym_id, hyponym_id, hyponym_greater (0/1)
with

pairs as (
    select $model as model, $release as release, hypernym_id, hyponym_id, hyponym_greater::integer as hyponym_greater
    from stg_hypernym_pairs
    where probe_set = $probe_set and zipf_gap <= $zipf_tolerance
),

final as (
    select * from pairs
)

select * from final
order by hypernym_id, hyponym_id
