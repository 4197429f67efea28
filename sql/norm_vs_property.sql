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
-- Ranking is the cost: stg_analysis_values holds the ranks of every value over its (probe set, property)
-- and of norm, n_tokens and zipf over the probe set, which are the sample's ranks wherever a property covers
-- the whole probe set (the usual case: no ranking here at all). A sample over part of a probe set, or the
-- items of a sample that also have a zipf, is ranked below: norm, n_tokens and zipf once per item set,
-- values with few distinct values by counting equal values, others by sorting.
-- params:  $model, $release
-- columns: model, release, probe_set, property, statistic, value, n
with

groups as (
    select
        v.group_key, g.probe_set, g.property, g.set_id, v.n_items, v.n_with_zipf,
        g.property <> 'zipf' and v.n_with_zipf > 0 as has_zipf_control,
        v.has_token_control,
        v.n_items = g.set_items as full_set
    from (
        select
            group_key, count(*) as n_items, count(zipf) as n_with_zipf,
            min(n_tokens) < max(n_tokens) as has_token_control
        from stg_analysis_values
        group by group_key
    ) as v
    inner join stg_analysis_groups as g using (group_key)
),

-- the samples statistics are computed on. sample_id = 2 * group_id: every item with the property;
-- 2 * group_id + 1: the items that also have a zipf, needed only where some lack one (else the zipf
-- control is computed on the first)
samples as (
    select *, 2 * group_id as sample_id, false as zipf_only
    from (select *, row_number() over (order by probe_set, property) as group_id from groups)
    union all
    select *, 2 * group_id + 1, true
    from (select *, row_number() over (order by probe_set, property) as group_id from groups)
    where has_zipf_control and n_with_zipf < n_items
),

-- every item of a probe set with the property: the staged ranks are the sample's
full_rows as (
    select
        s.sample_id, v.value, ln(v.norm) as log_norm, v.value_start + (v.value_count + 1) / 2.0 as r_value,
        v.r_norm, v.r_tokens, v.r_zipf
    from stg_analysis_values as v
    inner join samples as s using (group_key)
    where s.full_set and not s.zipf_only
),

-- the other samples: part of a probe set's items, or the items that also have a zipf
partial_members as (
    select s.sample_id, s.zipf_only, s.set_id, v.pos, v.norm, v.n_tokens, v.value, v.zipf,
        v.value_start + (v.value_count + 1) / 2.0 as r_value
    from stg_analysis_values as v
    inner join samples as s using (group_key)
    where (not s.full_set or s.zipf_only) and (not s.zipf_only or v.zipf is not null)
),

-- samples with the same item set share the ranks of the item-level variables norm, n_tokens and zipf
item_set_signatures as (
    select sample_id, any_value(set_id) as set_id, count(*) as n, sum(hash(pos)) as digest
    from partial_members
    group by sample_id
),

item_sets as (
    select
        sample_id,
        dense_rank() over (order by set_id, n, digest) as item_set_id,
        row_number() over (partition by set_id, n, digest order by sample_id) = 1 as represents_set
    from item_set_signatures
),

item_set_members as (
    select s.item_set_id, m.pos, m.norm, m.n_tokens, m.zipf
    from partial_members as m
    inner join item_sets as s using (sample_id)
    where s.represents_set
),

-- ranks of the item-level variables over each item set. norm is ranked by sorting: average rank =
-- (rank() + rows up to and including the tie group) / 2. n_tokens and zipf have few distinct values and are
-- ranked by counting equal values: average rank = rows up to and including the value - (count - 1) / 2
token_ranks as (
    select
        item_set_id, n_tokens,
        sum(c) over (partition by item_set_id order by n_tokens rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from (select item_set_id, n_tokens, count(*) as c from item_set_members group by all)
),

-- zipf is ranked only over item sets where every item has one
zipf_ranks as (
    select
        item_set_id, zipf,
        sum(c) over (partition by item_set_id order by zipf rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from (
        select item_set_id, zipf, count(*) as c
        from item_set_members
        where item_set_id in (
            select item_set_id from item_set_members group by item_set_id having count(zipf) = count(*)
        )
        group by all
    )
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

-- the property's ranks within a zipf-only sample (a subset of its group: the staged ranks do not apply),
-- by counting equal values where there are few, by sorting where there are many
zipf_only_info as (
    select sample_id, approx_count_distinct(value) * 8 <= count(*) as few_values
    from partial_members
    where zipf_only
    group by sample_id
),

value_ranks as (
    select
        sample_id, value,
        sum(c) over (partition by sample_id order by value rows between unbounded preceding and current row)
            - (c - 1) / 2.0 as r
    from (
        select sample_id, value, count(*) as c
        from partial_members
        where sample_id in (select sample_id from zipf_only_info where few_values)
        group by all
    )
),

partial_rows as (
    select m.sample_id, m.value, m.pos, m.norm, m.r_value
    from partial_members as m
    where not m.zipf_only
    union all
    select m.sample_id, m.value, m.pos, m.norm, v.r
    from partial_members as m
    inner join value_ranks as v on v.sample_id = m.sample_id and v.value = m.value
    union all
    select sample_id, value, pos, norm, (rank() over w_value + count(*) over w_value) / 2.0
    from partial_members
    where sample_id in (select sample_id from zipf_only_info where not few_values)
    window w_value as (partition by sample_id order by value)
),

sample_rows as (
    select * from full_rows
    union all
    select p.sample_id, p.value, ln(p.norm), p.r_value, i.r_norm, i.r_tokens, i.r_zipf
    from partial_rows as p
    inner join item_sets as s using (sample_id)
    inner join item_ranks as i on i.item_key = s.item_set_id * 4294967296 + p.pos
),

correlations as (
    select
        sample_id,
        corr(r_norm, r_value) as r_nv,
        corr(r_norm, r_tokens) as r_nt,
        corr(r_value, r_tokens) as r_vt,
        corr(r_norm, r_zipf) as r_nz,
        corr(r_value, r_zipf) as r_vz,
        corr(log_norm, value) as r_lx,
        count(*) as n
    from sample_rows
    group by sample_id
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
