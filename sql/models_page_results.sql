-- models_page_results: the main statistics of every audited (model, release), each from the latest
-- finished run that recorded it: Spearman and partial-given-zipf of the norm with each property, the
-- hypernym shares, the AUROC of the query norm for retrieval success, the token norms' Spearman with zipf.
-- params:  none
-- columns: model, release, analysis, probe_set, property, statistic, value, ci_low, ci_high, n
with

finished_runs as (
    select run_id from runs where status in ('completed', 'alerted')
),

main_results as (
    select res.*
    from results as res
    inner join finished_runs as f on f.run_id = res.run_id
    where (res.analysis = 'norm_vs_property' and res.statistic in ('spearman', 'partial_spearman_zipf'))
        or (res.analysis = 'hypernym_pairs'
            and res.statistic in ('share_hyponym_norm_greater', 'share_hyponym_norm_greater_zipf_matched'))
        or (res.analysis = 'retrieval_calibration' and res.statistic = 'auroc_query_norm')
        or (res.analysis = 'token_norm_vs_frequency' and res.statistic = 'spearman')
),

final as (
    select model, release, analysis, probe_set, property, statistic, value, ci_low, ci_high, n
    from main_results
    qualify row_number() over (
        partition by model, release, analysis, probe_set, property, statistic order by run_id desc
    ) = 1
)

select * from final
order by model, release, analysis, probe_set, property, statistic
