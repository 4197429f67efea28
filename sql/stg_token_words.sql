-- stg_token_words: the tokens of a release matched to the words of the probe sets, with the word's frequency.
-- Staged once per (model, release) (pipeline/analysis/sql.py): token_norm_vs_frequency.sql reads it, and a
-- paired comparison's paired_token_units.sql reads it per side.
-- Input: token_norms of the release, and word frequencies from any probe set: items of kind 'word' with a
-- 'zipf' property (e.g. wordnet-nouns, or a vocabulary probe set whose items are the model's whole-word
-- tokens). Tokens are matched to words case-insensitively on their whole-word form: for a
-- SentencePiece ('▁dog') or byte-level BPE ('Ġdog') vocabulary, tokens carrying that word-start marker,
-- marker removed; otherwise (WordPiece) tokens that are not continuation pieces ('##ing'). A word that
-- several items of one probe set spell the same way gets their mean zipf.
-- params:  $model, $release
-- columns: probe_set (supplying the frequencies), word (lower-cased), token_id, norm, zipf
with

tokens as (
    select token_id, token, norm
    from token_norms
    where model = $model and release = $release and token is not null
),

vocabulary_style as (
    select
        count_if(starts_with(token, '▁')) > 0 as sentencepiece,
        count_if(starts_with(token, 'Ġ')) > 0 as byte_bpe
    from tokens
),

whole_words as (
    select
        t.token_id, t.norm,
        lower(case when v.sentencepiece or v.byte_bpe then substr(t.token, 2) else t.token end) as word
    from tokens as t
    cross join vocabulary_style as v
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
        -- only words some token spells: the probe set may be far larger than the vocabulary
        and lower(i.text) in (select word from whole_words)
    group by all
),

final as (
    select f.probe_set, w.word, w.token_id, w.norm, f.zipf
    from whole_words as w
    inner join word_frequencies as f on f.word = w.word
)

select * from final
