-- paired_hypernym_pairs: the statistics of hypernym_pairs.sql on a weighted resample of the shared pairs, per
-- side and replicate: share_hyponym_norm_greater (over every shared pair) and
-- share_hyponym_norm_greater_zipf_matched (over the frequency-matched ones), each the weighted share
-- sum(w * greater) / sum(w), as on the pairs repeated w times. pipeline/analysis/paired_units.py runs it once
-- with every weight 1 (b = -1: the point values) and once per batch of replicates.
-- Inputs: paired_hypernym_pairs_units (paired_hypernym_units.sql through paired_positions.sql),
--         paired_weights (b, pos, w)
-- params:  none besides the inputs
-- columns: side, analysis, probe_set, property, statistic, b, value, n (the resample's size)
with

weighted as (
    select u.side, u.probe_set, u.greater, u.zipf_matched, w.b, w.w
    from paired_hypernym_pairs_units as u
    inner join paired_weights as w on w.pos = u.pos
    where u.shared
),

final as (
    select side, 'hypernym_pairs' as analysis, probe_set, 'hypernym_of' as property,
        'share_hyponym_norm_greater' as statistic, b, sum(w * greater) / sum(w) as value, sum(w) as n
    from weighted
    group by all
    union all
    select side, 'hypernym_pairs', probe_set, 'hypernym_of', 'share_hyponym_norm_greater_zipf_matched', b,
        sum(w * greater) / sum(w), sum(w)
    from weighted
    where zipf_matched
    group by all
)

select * from final
