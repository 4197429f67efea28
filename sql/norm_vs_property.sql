-- norm_vs_property: does the raw embedding norm track each probe property?
-- For every (model, release, probe set, property), over the items that have an embedding and the property:
--   spearman                   Spearman's rho between norm and the property (average ranks for ties, as
--                              scipy.stats.spearmanr)
--   pearson_log_norm           Pearson's r between ln(norm) and the property
--   partial_spearman_zipf      Spearman's rho with word frequency partialled out: the Pearson correlation of
--                              the residuals of rank(norm) and rank(property) after a least-squares fit of
--                              each on rank(zipf), ranks taken over the items that have a zipf; not reported
--                              for zipf itself
--   partial_spearman_n_tokens  the same with the tokenized length (embeddings.n_tokens) partialled out;
--                              reported only where n_tokens varies
-- The residual correlation is computed with the first-order partial correlation identity
-- (r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2)), which equals it exactly for least squares with an
-- intercept. Undefined statistics (a constant property, a constant control) produce no row.
-- Ranking is the cost: items are keyed by integers, variables with few distinct values are ranked by
-- counting equal values (no sort of the rows), and norm, n_tokens and zipf are ranked once per item set
-- rather than once per property. norm_vs_property_ci.sql computes each replicate the same way.
-- params:  $model, $release
-- columns: model, release, probe_set, property, statistic, value, n
with

-- the release's items with their property values, norm, n_tokens and zipf, joined once for the suite
joined as not materialized (
    select group_key, probe_set, property, item_key, pos, norm, n_tokens, value, zipf, r_norm, r_tokens, r_zipf,
        set_items
    from stg_analysis_values
),

-- one row per (probe set, property): which statistics exist, and a small integer id
coverage as (
    select
        group_key,
        any_value(probe_set) as probe_set,
        any_value(property) as property,
        count(*) as n_items,
        count(zipf) as n_with_zipf,
        any_value(property) <> 'zipf' and count(zipf) > 0 as has_zipf_control,
        min(n_tokens) < max(n_tokens) as has_token_control,
        any_value(set_items) as set_items
    from joined
    group by group_key
),

-- the samples statistics are computed on. sample_id = 2 * group_id: every item with the property;
-- 2 * group_id + 1: the items that also have a zipf, needed only where some lack one (else the zipf
-- control is computed on the first). A full sample holds every embedded item of its probe set: the
-- staged item ranks are its ranks (usually every sample). The others rank their own items below.
samples_declared as (
    select *, 2 * group_id as sample_id, false as zipf_only, n_items = set_items as full_set
    from (select *, row_number() over (order by probe_set, property) as group_id from coverage)
    union all
    select *, 2 * group_id + 1, true, false
    from (select *, row_number() over (order by probe_set, property) as group_id from coverage)
    where has_zipf_control and n_with_zipf < n_items
),

sample_members as not materialized (
    select s.sample_id, s.full_set, j.item_key, j.pos, j.norm, j.n_tokens, j.value, j.zipf, j.r_norm, j.r_tokens,
        j.r_zipf
    from joined as j
    inner join samples_declared as s using (group_key)
    where not s.zipf_only or j.zipf is not null
),

-- samples over part of a probe set: those with the same item set share the ranks of the item-level
-- variables norm, n_tokens and zipf
item_set_signatures as (
    select sample_id, any_value(item_key // 4294967296) as set_id, count(*) as n, sum(hash(item_key)) as digest
    from sample_members
    where not full_set
    group by sample_id
),

samples as (
    select
        d.*,
        dense_rank() over (order by g.set_id, g.n, g.digest) as item_set_id,
        row_number() over (partition by g.set_id, g.n, g.digest order by d.sample_id) = 1 as represents_set
    from samples_declared as d
    left join item_set_signatures as g using (sample_id)
),

item_set_members as (
    select s.item_set_id, m.pos, m.norm, m.n_tokens, m.zipf
    from sample_members as m
    inner join samples as s using (sample_id)
    where s.represents_set
),

-- ranks of the item-level variables over each item set, side by side. norm is ranked by sorting: average
-- rank = (rank() + rows up to and including the tie group) / 2. n_tokens and zipf have few distinct values
-- and are ranked by counting equal values: average rank = rows up to and including the value
-- - (count - 1) / 2, looked up in a small table instead of sorting the rows.
token_counts as (
    select item_set_id, n_tokens, count(*) as c from item_set_members group by all
),

token_ranks as (
    select
        item_set_id, n_tokens,
        sum(c) over (partition by item_set_id order by n_tokens rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from token_counts
),

-- zipf is ranked only over item sets where every item has one
zipf_sets as (
    select item_set_id from item_set_members group by item_set_id having count(zipf) = count(*)
),

zipf_counts as (
    select item_set_id, zipf, count(*) as c
    from item_set_members
    where item_set_id in (select item_set_id from zipf_sets)
    group by all
),

zipf_ranks as (
    select
        item_set_id, zipf,
        sum(c) over (partition by item_set_id order by zipf rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from zipf_counts
),

item_ranks as (
    select
        i.item_set_id * 4294967296 + i.pos as item_key,
        (rank() over w_norm + count(*) over w_norm) / 2.0 as r_norm,
        t.r as r_tokens,
        z.r as r_zipf
    from item_set_members as i
    inner join token_ranks as t on t.item_set_id = i.item_set_id and t.n_tokens = i.n_tokens
    left join zipf_ranks as z on z.item_set_id = i.item_set_id and z.zipf = i.zipf
    window w_norm as (partition by i.item_set_id order by i.norm)
),

-- ranks of the property within each sample: by counting equal values where there are few (integer
-- properties, rounded scores), by sorting where there are many
-- a sample's attributes in one small table, joined once per member row. few_values picks the cheaper of two
-- exact rankings, so an estimate of the distinct values will do
sample_info as (
    select
        s.sample_id, s.item_set_id,
        approx_count_distinct(m.value) * 8 <= count(*) as few_values
    from sample_members as m
    inner join samples as s using (sample_id)
    group by s.sample_id, s.item_set_id
),

sample_rows as not materialized (
    select
        m.sample_id, m.full_set, m.value, ln(m.norm) as log_norm, m.r_norm, m.r_tokens, m.r_zipf, i.few_values,
        i.item_set_id * 4294967296 + m.pos as item_key
    from sample_members as m
    inner join sample_info as i using (sample_id)
),

value_counts as (
    select sample_id, value, count(*) as c from sample_rows where few_values group by all
),

value_ranks as (
    select
        sample_id, value,
        sum(c) over (partition by sample_id order by value rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from value_counts
),

property_rows as (
    select r.sample_id, r.full_set, r.value, r.log_norm, v.r as r_value, r.r_norm, r.r_tokens, r.r_zipf, r.item_key
    from sample_rows as r
    inner join value_ranks as v on v.sample_id = r.sample_id and v.value = r.value
    where r.few_values
    union all
    select
        sample_id, full_set, value, log_norm, (rank() over w_value + count(*) over w_value) / 2.0, r_norm, r_tokens,
        r_zipf, item_key
    from sample_rows
    where not few_values
    window w_value as (partition by sample_id order by value)
),

correlations as (
    select
        p.sample_id,
        corr(r_norm, r_value) as r_nv,
        corr(r_norm, r_tokens) as r_nt,
        corr(r_value, r_tokens) as r_vt,
        corr(r_norm, r_zipf) as r_nz,
        corr(r_value, r_zipf) as r_vz,
        corr(log_norm, value) as r_lx,
        count(*) as n
    from (
        select
            p.sample_id, p.value, p.log_norm, p.r_value,
            if(p.full_set, p.r_norm, i.r_norm) as r_norm,
            if(p.full_set, p.r_tokens, i.r_tokens) as r_tokens,
            if(p.full_set, p.r_zipf, i.r_zipf) as r_zipf
        from property_rows as p
        left join item_ranks as i using (item_key)  -- item_key is null in full samples: no match
    ) as p
    group by p.sample_id
),

statistics as (
    select s.probe_set, s.property, 'spearman' as statistic, c.r_nv as value, c.n
    from correlations as c
    inner join samples as s using (sample_id)
    where not s.zipf_only
    union all
    select s.probe_set, s.property, 'pearson_log_norm', c.r_lx, c.n
    from correlations as c
    inner join samples as s using (sample_id)
    where not s.zipf_only
    union all
    select s.probe_set, s.property, 'partial_spearman_n_tokens',
        (c.r_nv - c.r_nt * c.r_vt) / sqrt((1 - c.r_nt * c.r_nt) * (1 - c.r_vt * c.r_vt)), c.n
    from correlations as c
    inner join samples as s using (sample_id)
    where not s.zipf_only and s.has_token_control
    union all
    select s.probe_set, s.property, 'partial_spearman_zipf',
        (c.r_nv - c.r_nz * c.r_vz) / sqrt((1 - c.r_nz * c.r_nz) * (1 - c.r_vz * c.r_vz)), c.n
    from correlations as c
    inner join samples as s using (sample_id)
    where s.has_zipf_control and s.zipf_only = (s.n_with_zipf < s.n_items)
),

final as (
    select $model as model, $release as release, s.*
    from statistics as s
    where s.value is not null and isfinite(s.value)
)

select * from final
order by probe_set, property, statistic
