-- paired_token_units: one side's tokens matched to words (stg_token_words.sql, staged for that side's model and
-- release: the matching of token_norm_vs_frequency.sql), as units of a paired comparison. The unit is the word:
-- across two vocabularies the shared units are the words both sides match; a word several tokens of one side
-- spell brings all of them, with the word's weight.
-- params:  $side (0 base, 1 other)
-- columns: side, probe_set (supplying the frequencies), unit (the lower-cased word), token_id, norm, zipf
with

final as (
    select $side as side, probe_set, word as unit, token_id, norm, zipf
    from stg_token_words
)

select * from final
