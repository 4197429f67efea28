-- token_norm_vs_frequency: does the norm of a token's input embedding track the word's frequency?
-- Input: token_norms of the release, and word frequencies from any probe set: items of kind 'word' with a
-- 'zipf' property (e.g. wordnet-nouns, or a vocabulary probe set whose items are the model's whole-word
-- tokens). Tokens are matched to words case-insensitively on their whole-word form: for a
-- SentencePiece ('▁dog') or byte-level BPE ('Ġdog') vocabulary, tokens carrying that word-start marker,
-- marker removed; otherwise (WordPiece) tokens that are not continuation pieces ('##ing'). A word that
-- several items of one probe set spell the same way gets their mean zipf.
-- Statistics per probe set supplying the frequencies, over the matched tokens: spearman (token norm vs
-- zipf, average ranks) and pearson_log_norm (ln token norm vs zipf).
-- params:  $model, $release
-- columns: model, release, probe_set, property ('zipf'), statistic, value, n (matched tokens)
with

tokens as (
    select model, release, token_id, token, norm
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
        t.model, t.release, t.token_id, t.norm,
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

matched as (
    select w.model, w.release, f.probe_set, w.token_id, w.norm, f.zipf
    from whole_words as w
    inner join word_frequencies as f on f.word = w.word
),

ranked as (
    select
        *,
        (rank() over w_norm + count(*) over w_norm) / 2.0 as r_norm,
        (rank() over w_zipf + count(*) over w_zipf) / 2.0 as r_zipf
    from matched
    window
        w_norm as (partition by model, release, probe_set order by norm),
        w_zipf as (partition by model, release, probe_set order by zipf)
),

statistics as (
    select model, release, probe_set, 'zipf' as property, 'spearman' as statistic,
        corr(r_norm, r_zipf) as value, count(*) as n
    from ranked
    group by all
    union all
    select model, release, probe_set, 'zipf', 'pearson_log_norm', corr(ln(norm), zipf), count(*)
    from matched
    group by all
),

final as (
    select * from statistics where value is not null and isfinite(value)
)

select * from final
order by probe_set, statistic
