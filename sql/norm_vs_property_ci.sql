-- norm_vs_property_ci: bootstrap 95% confidence intervals for the statistics of norm_vs_property.
-- Method: Poisson bootstrap, seeded. In replicate b every item gets a weight w ~ Poisson(1) (capped at 10;
-- P(w > 10) = 1e-8) and appears w times in the resample; all properties of a probe set share the replicate's
-- weights, so a replicate is one resample of items. Each replicate statistic is computed as on the full
-- sample, average ranks recomputed over the resample (an item's w copies form one tie group: the same as
-- numpy.repeat then scipy.stats.spearmanr). The interval is the 2.5% and 97.5% percentiles of the replicate
-- statistics (linear interpolation, as numpy.quantile); replicates where a statistic is undefined are
-- dropped, and n_resamples says how many remained.
-- Weights are reproducible anywhere: u = mix32(mix32((seed * 2654435769 + b) mod 2^32) xor pos), where pos is
-- the item's 0-based position among its probe set's embedded items ordered by item_id, and mix32 is the
-- "lowbias32" integer hash (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16,
-- mod 2^32); w = the number of k in 0..9 with u >= floor(P(Poisson(1) <= k) * 2^32).
-- params:  $model, $release, $resamples (e.g. 1000), $seed (0 <= seed < 2^32)
-- columns: model, release, probe_set, property, statistic, ci_low, ci_high, n_resamples
with

-- the release's items with their property values, norm, n_tokens and zipf, joined once for the suite
joined as (
    select group_key, probe_set, property, item_key, pos, norm, n_tokens, value, zipf
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
        min(n_tokens) < max(n_tokens) as has_token_control
    from joined
    group by group_key
),

-- the samples statistics are computed on. sample_id = 2 * group_id: every item with the property;
-- 2 * group_id + 1: the items that also have a zipf, needed only where some lack one (else the zipf
-- control is computed on the first)
samples_declared as (
    select *, 2 * group_id as sample_id, false as zipf_only
    from (select *, row_number() over (order by probe_set, property) as group_id from coverage)
    union all
    select *, 2 * group_id + 1, true
    from (select *, row_number() over (order by probe_set, property) as group_id from coverage)
    where has_zipf_control and n_with_zipf < n_items
),

sample_members as (
    select s.sample_id, j.item_key, j.pos, j.norm, j.n_tokens, j.value, j.zipf
    from joined as j
    inner join samples_declared as s using (group_key)
    where not s.zipf_only or j.zipf is not null
),

-- samples with the same item set (usually: every item has every property) share the ranks of the
-- item-level variables norm, n_tokens and zipf
item_set_signatures as (
    select sample_id, any_value(item_key // 4294967296) as set_id, count(*) as n, sum(hash(item_key)) as digest
    from sample_members
    group by sample_id
),

samples as (
    select
        d.*,
        dense_rank() over (order by g.set_id, g.n, g.digest) as item_set_id,
        row_number() over (partition by g.set_id, g.n, g.digest order by d.sample_id) = 1 as represents_set
    from samples_declared as d
    inner join item_set_signatures as g using (sample_id)
),

item_set_members as (
    select s.item_set_id, m.pos, m.norm, m.n_tokens, m.zipf
    from sample_members as m
    inner join samples as s using (sample_id)
    where s.represents_set
),

-- the Poisson weights: one row per (replicate, position) with w > 0. Each mixing step is its own CTE:
-- a select-list expression that names another column alias of the same list is inlined, and the hash
-- would be evaluated once per reference, exponentially many times.
replicate_keys as (
    select
        b,
        ((($seed::ubigint % 4294967296) * 2654435769 + b::ubigint) % 4294967296)::ubigint as k0,
        xor(k0, k0 >> 16) as k1,
        (k1 * 2146121005) % 4294967296 as k2,
        xor(k2, k2 >> 15) as k3,
        (k3 * 2221713035) % 4294967296 as k4,
        xor(k4, k4 >> 16) as key
    from range($resamples) as t(b)
),

-- positions are 0..n-1 in every probe set: the weights of 0..(largest n)-1 serve them all. "& (2^32 - 1)"
-- is "mod 2^32" on these non-negative integers, and cheaper
positions as (
    select range as pos from range((select max(pos) + 1 from joined))
),

mix_0 as (
    select r.b, p.pos, xor(r.key, (p.pos & 4294967295)::ubigint) as h from positions as p cross join replicate_keys as r
),

mix_1 as (select b, pos, xor(h, h >> 16) as h from mix_0),
mix_2 as (select b, pos, (h * 2146121005) & 4294967295 as h from mix_1),
mix_3 as (select b, pos, xor(h, h >> 15) as h from mix_2),
mix_4 as (select b, pos, (h * 2221713035) & 4294967295 as h from mix_3),
mix_5 as (select b, pos, xor(h, h >> 16) as h from mix_4),

poisson as (
    select
        b, pos,
        (h >= 1580030168)::int + (h >= 3160060337)::int + (h >= 3950075421)::int + (h >= 4213413783)::int
        + (h >= 4279248373)::int + (h >= 4292415291)::int + (h >= 4294609777)::int + (h >= 4294923276)::int
        + (h >= 4294962463)::int + (h >= 4294966817)::int as w
    from mix_5
),

weights as (
    select b, pos, w from poisson where w > 0
),

-- centres for the Pearson sums: ln(norm) over an item set, the property over a sample
item_set_centres as (
    select item_set_id, avg(ln(norm)) as mean_log_norm from item_set_members group by item_set_id
),

sample_centres as (
    select sample_id, avg(value) as mean_value from sample_members group by sample_id
),

-- every (item set, replicate, item) and (sample, replicate, item) of a resample, with its weight;
-- item_rep = item_set_id * resamples + b and sample_rep = sample_id * resamples + b are integer keys
item_rows as (
    select
        i.item_set_id * $resamples + w.b as item_rep, i.pos, w.w, i.norm, i.n_tokens, i.zipf,
        ln(i.norm) - c.mean_log_norm as x_log_norm
    from item_set_members as i
    inner join item_set_centres as c using (item_set_id)
    inner join weights as w using (pos)
),

replicate_sizes as (
    select item_rep, sum(w) as size from item_rows group by item_rep
),

-- n_tokens and zipf have few distinct values: the weight of each value in the resample gives its average
-- rank = weight up to and including the value - (weight - 1) / 2, looked up instead of sorting rows
token_ranks as (
    select
        item_rep, n_tokens,
        sum(weight) over (partition by item_rep order by n_tokens rows between unbounded preceding and current row)
            - (weight - 1) / 2.0 as r
    from (select item_rep, n_tokens, sum(w) as weight from item_rows group by all)
),

zipf_sets as (
    select item_set_id from item_set_members group by item_set_id having count(zipf) = count(*)
),

zipf_ranks as (
    select
        item_rep, zipf,
        sum(weight) over (partition by item_rep order by zipf rows between unbounded preceding and current row)
            - (weight - 1) / 2.0 as r
    from (
        select item_rep, zipf, sum(w) as weight
        from item_rows
        where item_rep // $resamples in (select item_set_id from zipf_sets)
        group by all
    )
),

-- norm is ranked by sorting each resample once, one row per item with its weight w (its w copies form one
-- tie group): average rank = weight of the items up to and including its tie group - (weight of the tie
-- group - 1) / 2; both sums come from one sort (RANGE frames include the peers). Ranks are centred on
-- their exact mean (size + 1) / 2, so weighted sums of products are central moments.
item_ranks as (
    select
        r.item_rep // $resamples as item_set_id, r.item_rep % $resamples as b, r.pos, r.w, r.x_log_norm,
        t.r - (s.size + 1) / 2.0 as r_tokens,
        z.r - (s.size + 1) / 2.0 as r_zipf,
        sum(r.w::double) over w_up_to - (sum(r.w::double) over w_ties - 1) / 2.0 - (s.size + 1) / 2.0 as r_norm,
        (s.size + 1) / 2.0 as mid
    from item_rows as r
    inner join replicate_sizes as s using (item_rep)
    inner join token_ranks as t on t.item_rep = r.item_rep and t.n_tokens = r.n_tokens
    left join zipf_ranks as z on z.item_rep = r.item_rep and z.zipf = r.zipf
    window
        w_up_to as (partition by r.item_rep order by r.norm range between unbounded preceding and current row),
        w_ties as (partition by r.item_rep order by r.norm range between current row and current row)
),

-- a sample's attributes in one small table: one join per member row, before the rows are replicated
sample_info as (
    select
        s.sample_id, s.item_set_id, c.mean_value,
        -- a performance choice only (both rankings are exact): an estimate of the distinct values will do
        approx_count_distinct(m.value) * 8 <= count(*) as few_values
    from sample_members as m
    inner join samples as s using (sample_id)
    inner join sample_centres as c using (sample_id)
    group by s.sample_id, s.item_set_id, c.mean_value
),

member_info as not materialized (
    select m.sample_id, i.item_set_id, m.pos, m.value, m.value - i.mean_value as x_value, i.few_values
    from sample_members as m
    inner join sample_info as i using (sample_id)
),

-- the property within each (sample, replicate): where it has few distinct values, the weight of each
-- value in the resample gives its average rank (as n_tokens above); where many, the weighted rows are
-- sorted (as norm above). Each member row of a resample meets its item's ranks in one join on
-- (item set, position).
value_ranks as (
    select
        sample_rep, value,
        sum(weight) over (partition by sample_rep order by value rows between unbounded preceding and current row)
            - (weight - 1) / 2.0 as r
    from (
        select m.sample_id * $resamples + w.b as sample_rep, m.value, sum(w.w) as weight
        from member_info as m
        inner join weights as w using (pos)
        where m.few_values
        group by all
    )
),

property_rows as (
    select
        m.sample_id * $resamples + i.b as sample_rep, i.w, i.r_norm, i.r_tokens, i.r_zipf, i.x_log_norm, i.mid,
        m.x_value, v.r as r_value
    from member_info as m
    inner join item_ranks as i on i.item_set_id = m.item_set_id and i.pos = m.pos
    inner join value_ranks as v on v.sample_rep = m.sample_id * $resamples + i.b and v.value = m.value
    where m.few_values
    union all
    select
        sample_rep, w, r_norm, r_tokens, r_zipf, x_log_norm, mid, x_value,
        sum(w::double) over w_up_to - (sum(w::double) over w_ties - 1) / 2.0 as r_value
    from (
        select
            m.sample_id * $resamples + i.b as sample_rep, m.value, i.w, i.r_norm, i.r_tokens, i.r_zipf,
            i.x_log_norm, i.mid, m.x_value
        from member_info as m
        inner join item_ranks as i on i.item_set_id = m.item_set_id and i.pos = m.pos
        where not m.few_values
    )
    window
        w_up_to as (partition by sample_rep order by value range between unbounded preceding and current row),
        w_ties as (partition by sample_rep order by value range between current row and current row)
),

moments as (
    select
        sample_rep // $resamples as sample_id,
        sample_rep % $resamples as b,
        sum(w * r_norm * (r_value - mid)) as snv,
        sum(w * r_norm * r_norm) as snn,
        sum(w * (r_value - mid) ^ 2) as svv,
        sum(w * r_norm * r_tokens) as snt,
        sum(w * (r_value - mid) * r_tokens) as svt,
        sum(w * r_tokens * r_tokens) as stt,
        sum(w * r_norm * r_zipf) as snz,
        sum(w * (r_value - mid) * r_zipf) as svz,
        sum(w * r_zipf * r_zipf) as szz,
        sum(w) as sw,
        sum(w * x_log_norm) as sl, sum(w * x_value) as sx,
        sum(w * x_log_norm * x_log_norm) as sll, sum(w * x_value * x_value) as sxx,
        sum(w * x_log_norm * x_value) as slx
    from property_rows
    group by sample_rep
),

replicate_correlations as (
    select
        sample_id, b,
        snv / sqrt(snn * svv) as r_nv,
        snt / sqrt(snn * stt) as r_nt,
        svt / sqrt(svv * stt) as r_vt,
        snz / sqrt(snn * szz) as r_nz,
        svz / sqrt(svv * szz) as r_vz,
        (sw * slx - sl * sx) / sqrt((sw * sll - sl * sl) * (sw * sxx - sx * sx)) as r_lx
    from moments
),

replicate_statistics as (
    select s.probe_set, s.property, 'spearman' as statistic, r.b, r.r_nv as value
    from replicate_correlations as r
    inner join samples as s using (sample_id)
    where not s.zipf_only
    union all
    select s.probe_set, s.property, 'pearson_log_norm', r.b, r.r_lx
    from replicate_correlations as r
    inner join samples as s using (sample_id)
    where not s.zipf_only
    union all
    select s.probe_set, s.property, 'partial_spearman_n_tokens', r.b,
        (r.r_nv - r.r_nt * r.r_vt) / sqrt((1 - r.r_nt * r.r_nt) * (1 - r.r_vt * r.r_vt))
    from replicate_correlations as r
    inner join samples as s using (sample_id)
    where not s.zipf_only and s.has_token_control
    union all
    select s.probe_set, s.property, 'partial_spearman_zipf', r.b,
        (r.r_nv - r.r_nz * r.r_vz) / sqrt((1 - r.r_nz * r.r_nz) * (1 - r.r_vz * r.r_vz))
    from replicate_correlations as r
    inner join samples as s using (sample_id)
    where s.has_zipf_control and s.zipf_only = (s.n_with_zipf < s.n_items)
),

intervals as (
    select
        probe_set, property, statistic,
        quantile_cont(value, 0.025) as ci_low,
        quantile_cont(value, 0.975) as ci_high,
        count(*) as n_resamples
    from replicate_statistics
    where value is not null and isfinite(value)
    group by all
),

final as (
    select $model as model, $release as release, i.*
    from intervals as i
)

select * from final
order by probe_set, property, statistic
