-- stg_analysis_values: the rows the norm analyses share, joined once per (model, release).
-- One row per embedded item and non-null property value of the release's probe sets, keyed by integers,
-- with the item's norm, token count and zipf beside the value. norm_vs_property, norm_vs_property_ci and
-- norm_by_bin read this table instead of joining embeddings to probe_properties on strings each: the string
-- join and the sort of item ids are the costly part of staging, and are done once for the whole suite.
-- pipeline/analysis.py creates it as a temporary table of this name on a connection, for one scope, before
-- the first query that reads it (and again when a query asks for another model or release).
--   group_key  hash(probe_set, property): one integer per (probe set, property)
--   pos        the item's 0-based position among its probe set's embedded items ordered by item_id (the
--              bootstrap weights of norm_vs_property_ci are a function of it; it also breaks ties in
--              item_id order)
--   item_key   set_id * 2^32 + pos, set_id numbering the probe sets in name order: one integer per item
--   r_norm, r_tokens, r_zipf   average ranks (ties share the mean rank, as scipy.stats.rankdata) of norm,
--              n_tokens and zipf among the probe set's embedded items; r_zipf only where all of them have a
--              zipf. norm_vs_property uses them for every property that all of a probe set's items have
--   set_items  how many embedded items the probe set has
-- params:  $model, $release
-- columns: group_key, probe_set, property, item_key, pos, value, norm, n_tokens, zipf, r_norm, r_tokens,
--          r_zipf, set_items
with

zipf as (
    select probe_set, item_id, value as zipf from probe_properties where property = 'zipf'
),

embeddings_in_scope as (
    select
        e.probe_set, e.item_id, e.norm, e.n_tokens, z.zipf,
        row_number() over (partition by e.probe_set order by e.item_id) - 1 as pos,
        (rank() over w_norm + count(*) over w_norm) / 2.0 as r_norm
    from embeddings as e
    left join zipf as z on z.probe_set = e.probe_set and z.item_id = e.item_id
    where e.model = $model and e.release = $release
    window w_norm as (partition by e.probe_set order by e.norm)
),

-- n_tokens and zipf have few distinct values: average rank = items up to and including the value
-- - (items with the value - 1) / 2, from counts instead of a sort
set_sizes as (
    select probe_set, count(*) as set_items, count(zipf) = count(*) as all_have_zipf
    from embeddings_in_scope
    group by probe_set
),

token_ranks as (
    select
        probe_set, n_tokens,
        sum(c) over (partition by probe_set order by n_tokens rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from (select probe_set, n_tokens, count(*) as c from embeddings_in_scope group by all)
),

zipf_ranks as (
    select
        probe_set, zipf,
        sum(c) over (partition by probe_set order by zipf rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from (
        select probe_set, zipf, count(*) as c
        from embeddings_in_scope
        where probe_set in (select probe_set from set_sizes where all_have_zipf)
        group by all
    )
),

probe_sets as (
    select probe_set, set_items, row_number() over (order by probe_set) as set_id from set_sizes
),

properties as (
    select probe_set, item_id, property, value from probe_properties where value is not null
),

final as (
    select
        hash(e.probe_set, p.property) as group_key,
        e.probe_set,
        p.property,
        s.set_id * 4294967296 + e.pos as item_key,
        e.pos,
        p.value,
        e.norm,
        e.n_tokens,
        e.zipf,
        e.r_norm,
        t.r as r_tokens,
        z.r as r_zipf,
        s.set_items
    from embeddings_in_scope as e
    inner join probe_sets as s on s.probe_set = e.probe_set
    inner join token_ranks as t on t.probe_set = e.probe_set and t.n_tokens = e.n_tokens
    left join zipf_ranks as z on z.probe_set = e.probe_set and z.zipf = e.zipf
    inner join properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
)

select * from final
