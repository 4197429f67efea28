-- stg_analysis_values: the rows the norm analyses share, joined and ranked once per (model, release).
-- One row per embedded item and non-null property value of the release's probe sets, keyed by integers,
-- with the item's norm, token count and zipf beside the value, and the ranks of each. norm_vs_property,
-- norm_vs_property_ci and norm_by_bin read this table instead of joining embeddings to probe_properties on
-- strings and sorting values each: the string join and the sorts are the costly part, and are done once.
-- pipeline/analysis/sql.py creates it as a temporary table of this name on a connection, for one scope, before
-- the first query that reads it (and again when a query asks for another model or release).
--   group_key  hash(probe_set, property): one integer per (probe set, property); stg_analysis_groups has
--              the names
--   pos        the item's 0-based position among its probe set's embedded items ordered by item_id (the
--              bootstrap weights of norm_vs_property_ci are a function of it; it also breaks ties in
--              item_id order)
--   r_norm, r_tokens, r_zipf   average ranks (ties share the mean rank, as scipy.stats.rankdata) of norm,
--              n_tokens and zipf among the probe set's embedded items; r_zipf only where all of them have a
--              zipf
--   d_norm     dense rank of norm among the probe set's embedded items, from 0: ties share it, and it orders
--              any subset of them as norm does (the bootstrap sorts on it, an integer)
--   norm_tied  whether another embedded item of the probe set has the same norm (the bootstrap weighs tie
--              groups only where there are some)
--   value_start, value_count   the value's rows among the group's rows in value order: they hold 0-based
--              positions value_start .. value_start + value_count - 1, so the value's average rank is
--              value_start + (value_count + 1) / 2
--   d_value    dense rank of the value in its group, from 0
-- Values are ranked by counting equal values where a group has few distinct values (integer properties,
-- rounded scores) and by sorting where it has many; the choice only changes the cost.
-- It reads stg_analysis_items (sql/stg_analysis_items.sql: per-item positions and ranks), staged just before it
-- for the same scope: no parameters of its own.
-- Positions and counts are 32-bit integers: the table is the largest thing an audit holds in memory.
-- columns: group_key, pos, value, norm, n_tokens, zipf, r_norm, d_norm, norm_tied, r_tokens, r_zipf,
--          value_start, value_count, d_value
with

-- zipf is ranked only over probe sets where every embedded item has one
zipf_coverage as (
    select probe_set, count(zipf) = count(*) as all_have_zipf
    from stg_analysis_items
    group by probe_set
),

-- n_tokens and zipf have few distinct values: average rank = items up to and including the value
-- - (items with the value - 1) / 2, from counts instead of a sort
token_ranks as (
    select
        probe_set, n_tokens,
        sum(c) over (partition by probe_set order by n_tokens rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from (select probe_set, n_tokens, count(*) as c from stg_analysis_items group by all)
),

zipf_ranks as (
    select
        probe_set, zipf,
        sum(c) over (partition by probe_set order by zipf rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from (
        select probe_set, zipf, count(*) as c
        from stg_analysis_items
        where probe_set in (select probe_set from zipf_coverage where all_have_zipf)
        group by all
    )
),

properties as (
    select probe_set, item_id, property, value from probe_properties where value is not null
),

-- the join, written once and read by the rankings below (strings end here)
joined as materialized (
    select
        hash(e.probe_set, p.property) as group_key,
        e.pos::integer as pos,
        p.value,
        e.norm,
        e.n_tokens,
        e.zipf,
        e.r_norm,
        e.d_norm::integer as d_norm,
        e.norm_tied,
        t.r as r_tokens,
        z.r as r_zipf
    from stg_analysis_items as e
    inner join token_ranks as t on t.probe_set = e.probe_set and t.n_tokens = e.n_tokens
    left join zipf_ranks as z on z.probe_set = e.probe_set and z.zipf = e.zipf
    inner join properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
),

-- an estimate of the distinct values will do: both rankings are exact
group_kinds as (
    select group_key, approx_count_distinct(value) * 8 <= count(*) as few_values from joined group by group_key
),

value_spans as (
    select
        group_key, value, c as value_count,
        sum(c) over (partition by group_key order by value rows between unbounded preceding and current row) - c
            as value_start,
        row_number() over (partition by group_key order by value) - 1 as d_value
    from (
        select group_key, value, count(*) as c
        from joined
        where group_key in (select group_key from group_kinds where few_values)
        group by all
    )
),

final as (
    select
        j.*, v.value_start::integer as value_start, v.value_count::integer as value_count,
        v.d_value::integer as d_value
    from joined as j
    inner join value_spans as v on v.group_key = j.group_key and v.value = j.value
    union all
    -- count(*) runs through the value's peers: less rank() - 1, it counts the value's rows
    select
        *, (rank() over w - 1)::integer, (count(*) over w - rank() over w + 1)::integer, (dense_rank() over w - 1)::integer
    from joined
    where group_key in (select group_key from group_kinds where not few_values)
    window w as (partition by group_key order by value)
)

select * from final
