-- token_norm_vs_frequency: does the norm of a token's input embedding track the word's frequency?
-- Input: stg_token_words (tokens matched to the words of the probe sets, with the word's zipf; its header
-- gives the matching rules).
-- Statistics per probe set supplying the frequencies, over the matched tokens: spearman (token norm vs
-- zipf, average ranks) and pearson_log_norm (ln token norm vs zipf).
-- params:  $model, $release
-- columns: model, release, probe_set, property ('zipf'), statistic, value, n (matched tokens)
with

matched as (
    select $model as model, $release as release, probe_set, token_id, norm, zipf
    from stg_token_words
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
