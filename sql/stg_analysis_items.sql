-- stg_analysis_items: one row per embedded item of the release, with the ranks of its norm that
-- stg_analysis_values gives each of its property rows. The third of the four statements that stage
-- stg_analysis_values (pipeline/analysis/sql.py): it reads stg_analysis_positions, staged just before it for
-- the same scope, and is dropped once stg_analysis_values is staged.
--   r_norm     average rank of norm among the probe set's embedded items (ties share the mean rank)
--   d_norm     dense rank of norm, from 0
--   norm_tied  whether another embedded item of the probe set has the same norm
-- params:  none of its own (its scope is stg_analysis_positions')
-- columns: probe_set, item_id, norm, n_tokens, zipf, pos, r_norm, d_norm, norm_tied
with

final as (
    select
        *,
        (rank() over w_norm + count(*) over w_norm) / 2.0 as r_norm,
        dense_rank() over w_norm - 1 as d_norm,
        -- tied where the rows through its tie group outnumber the rows up to the group's first (its rank)
        count(*) over w_norm > rank() over w_norm as norm_tied
    from stg_analysis_positions
    window w_norm as (partition by probe_set order by norm)
)

select * from final
