-- paired_token_units: the tokens token_norm_vs_frequency.sql matches to words (same matching rules), per side
-- of a paired comparison. The unit is the word: across two vocabularies the shared units are the words both
-- sides match; a word several tokens of one side spell brings all of them, with the word's weight.
-- params:  $base_model, $base_release, $other_model, $other_release
-- columns: side (0 base, 1 other), probe_set (supplying the frequencies), unit (the lower-cased word),
--          token_id, norm, zipf
with

sides as (
    select * from (values (0, $base_model, $base_release), (1, $other_model, $other_release))
        as t(side, model, release)
),

tokens as (
    select s.side, t.token_id, t.token, t.norm
    from token_norms as t
    inner join sides as s on s.model = t.model and s.release = t.release
    where t.token is not null
),

vocabulary_style as (
    select
        side,
        count_if(starts_with(token, '▁')) > 0 as sentencepiece,
        count_if(starts_with(token, 'Ġ')) > 0 as byte_bpe
    from tokens
    group by side
),

whole_words as (
    select
        t.side, t.token_id, t.norm,
        lower(case when v.sentencepiece or v.byte_bpe then substr(t.token, 2) else t.token end) as word
    from tokens as t
    inner join vocabulary_style as v using (side)
    where case
        when v.sentencepiece then starts_with(t.token, '▁')
        when v.byte_bpe then starts_with(t.token, 'Ġ')
        else not starts_with(t.token, '##')
    end
),

word_frequencies as (
    select i.probe_set, lower(i.text) as word, avg(p.value) as zipf
    from probe_items as i
    inner join probe_properties as p on p.probe_set = i.probe_set and p.item_id = i.item_id
    where i.kind = 'word' and p.property = 'zipf' and p.value is not null
        and lower(i.text) in (select word from whole_words)
    group by all
),

final as (
    select w.side, f.probe_set, w.word as unit, w.token_id, w.norm, f.zipf
    from whole_words as w
    inner join word_frequencies as f on f.word = w.word
)

select * from final
