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

embeddings_in_scope as (
    select
        probe_set, item_id, norm, n_tokens,
        (row_number() over (partition by probe_set order by item_id) - 1)::ubigint as pos
    from embeddings
    where model = $model and release = $release
),

properties as (
    select probe_set, item_id, property, value from probe_properties where value is not null
),

zipf as (
    select probe_set, item_id, value as zipf from probe_properties where property = 'zipf'
),

joined as (
    select e.probe_set, p.property, e.item_id, e.pos, e.norm, e.n_tokens, p.value, z.zipf
    from embeddings_in_scope as e
    inner join properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
    left join zipf as z on z.probe_set = e.probe_set and z.item_id = e.item_id
),

-- one row per (probe set, property): which statistics exist (as in norm_vs_property), and an integer id
-- (window partitions on one integer key sort several times faster than on strings)
coverage as (
    select
        probe_set, property,
        row_number() over (order by probe_set, property) as group_id,
        count(*) as n_items,
        count(zipf) as n_with_zipf,
        property <> 'zipf' and count(zipf) > 0 as has_zipf_control,
        min(n_tokens) < max(n_tokens) as has_token_control
    from joined
    group by probe_set, property
),

-- the samples statistics are computed on. sample_id = 2 * group_id: every item with the property;
-- 2 * group_id + 1: the items that also have a zipf, needed only where some lack one (else the zipf
-- control is computed on the first)
samples_declared as (
    select *, 2 * group_id as sample_id, false as zipf_only from coverage
    union all
    select *, 2 * group_id + 1, true from coverage where has_zipf_control and n_with_zipf < n_items
),

sample_members as (
    select s.sample_id, j.probe_set, j.item_id, j.pos, j.norm, j.n_tokens, j.value, j.zipf,
        j.value - avg(j.value) over (partition by s.sample_id) as x_value
    from joined as j
    inner join samples_declared as s using (probe_set, property)
    where not s.zipf_only or j.zipf is not null
),

-- samples with the same item set (usually: every item has every property) share the ranks of the
-- item-level variables norm, n_tokens and zipf, computed once per item set instead of once per property
item_set_signatures as (
    select sample_id, probe_set, count(*) as n, sum(hash(item_id)) as digest
    from sample_members
    group by sample_id, probe_set
),

samples as (
    select d.*, dense_rank() over (order by g.probe_set, g.n, g.digest) as item_set_id
    from samples_declared as d
    inner join item_set_signatures as g using (sample_id)
),

item_set_members as (
    select
        item_set_id, pos, norm, n_tokens, zipf,
        ln(norm) - avg(ln(norm)) over (partition by item_set_id) as x_log_norm
    from (
        select distinct s.item_set_id, m.pos, m.norm, m.n_tokens, m.zipf
        from sample_members as m
        inner join samples as s using (sample_id)
    )
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

positions as (
    select distinct pos from joined
),

mix_0 as (
    select r.b, p.pos, xor(r.key, p.pos % 4294967296) as h from positions as p cross join replicate_keys as r
),

mix_1 as (select b, pos, xor(h, h >> 16) as h from mix_0),
mix_2 as (select b, pos, (h * 2146121005) % 4294967296 as h from mix_1),
mix_3 as (select b, pos, xor(h, h >> 15) as h from mix_2),
mix_4 as (select b, pos, (h * 2221713035) % 4294967296 as h from mix_3),
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

-- every variable to rank, in long form: rank set 4 * sample_id ranks the property over a sample; rank sets
-- 4 * item_set_id + 1, + 2, + 3 rank norm, n_tokens and zipf over an item set (zipf only where every item
-- of the set has one). rank_key = rank_set * resamples + b is one integer partition key. y rides along:
-- the centred property (for sets 4k) or centred ln(norm) (for sets 4k + 1), for the Pearson statistic.
rank_sets as (
    select 4 * sample_id as rank_set, pos, value as x, x_value as y from sample_members
    union all
    select 4 * item_set_id + 1, pos, norm, x_log_norm from item_set_members
    union all
    select 4 * item_set_id + 2, pos, n_tokens, null from item_set_members
    union all
    select 4 * item_set_id + 3, pos, zipf, null from item_set_members
    where item_set_id in (select item_set_id from item_set_members group by all having count(zipf) = count(*))
),

-- few distinct values (integer properties, token counts): rank by grouping equal values, which sorts only
-- the distinct values; many: rank rows directly
rank_set_shapes as (
    select rank_set, count(distinct x) * 8 <= count(*) as few_values from rank_sets group by rank_set
),

rank_rows as (
    select r.rank_set, w.b, r.rank_set * $resamples + w.b as rank_key, r.pos, r.x, r.y, w.w, s.few_values
    from rank_sets as r
    inner join rank_set_shapes as s using (rank_set)
    inner join weights as w using (pos)
),

replicate_sizes as (
    select rank_key, sum(w) as size from rank_rows group by rank_key
),

-- ranks are centred on their exact mean (size + 1) / 2, so that weighted sums of products are central moments.
-- many values: an item of weight w as w rows; average rank = (rank() + rows up to and including the tie
-- group) / 2, where rank() and cume_dist() share one sort and cume_dist() * size is that row count
copies as (
    select rank_set, b, rank_key, pos, x, y, w, unnest(range(w)) as copy from rank_rows where not few_values
),

ranks_of_rows as (
    select rank_set, b, pos, w, y, r
    from (
        select
            c.rank_set, c.b, c.pos, c.w, c.y, c.copy,
            (rank() over w_x + round(cume_dist() over w_x * s.size) - s.size - 1) / 2.0 as r
        from copies as c
        inner join replicate_sizes as s using (rank_key)
        window w_x as (partition by c.rank_key order by c.x)
    )
    where copy = 0
),

-- few values: the weight of each distinct value; its average rank = weight up to and including it
-- - (weight - 1) / 2
value_weights as (
    select rank_key, x, sum(w) as weight from rank_rows where few_values group by rank_key, x
),

value_ranks as (
    select
        v.rank_key, v.x,
        sum(v.weight) over (partition by v.rank_key order by v.x rows between unbounded preceding and current row)
            - (v.weight - 1) / 2.0 - (s.size + 1) / 2.0 as r
    from value_weights as v
    inner join replicate_sizes as s using (rank_key)
),

ranks_of_values as (
    select r.rank_set, r.b, r.pos, r.w, r.y, v.r
    from rank_rows as r
    inner join value_ranks as v on v.rank_key = r.rank_key and v.x = r.x
    where r.few_values
),

ranked as (
    select * from ranks_of_rows
    union all
    select * from ranks_of_values
),

-- norm, n_tokens and zipf ranks side by side, one row per (item set, replicate, item)
item_ranks as (
    select
        ((rank_set // 4) * $resamples + b) * 4294967296 + pos as item_key,
        max(r) filter (where rank_set % 4 = 1) as r_norm,
        max(y) filter (where rank_set % 4 = 1) as x_log_norm,
        max(r) filter (where rank_set % 4 = 2) as r_tokens,
        max(r) filter (where rank_set % 4 = 3) as r_zipf
    from ranked
    where rank_set % 4 <> 0
    group by all
),

property_ranks as (
    select
        s.sample_id, r.b, r.w, r.y as x_value, r.r as r_value,
        (s.item_set_id * $resamples + r.b) * 4294967296 + r.pos as item_key
    from ranked as r
    inner join samples as s on s.sample_id = r.rank_set // 4
    where r.rank_set % 4 = 0
),

moments as (
    select
        p.sample_id, p.b,
        sum(p.w * i.r_norm * p.r_value) as snv, sum(p.w * i.r_norm * i.r_norm) as snn,
        sum(p.w * p.r_value * p.r_value) as svv,
        sum(p.w * i.r_norm * i.r_tokens) as snt, sum(p.w * p.r_value * i.r_tokens) as svt,
        sum(p.w * i.r_tokens * i.r_tokens) as stt,
        sum(p.w * i.r_norm * i.r_zipf) as snz, sum(p.w * p.r_value * i.r_zipf) as svz,
        sum(p.w * i.r_zipf * i.r_zipf) as szz,
        sum(p.w) as sw,
        sum(p.w * i.x_log_norm) as sl, sum(p.w * p.x_value) as sx,
        sum(p.w * i.x_log_norm * i.x_log_norm) as sll, sum(p.w * p.x_value * p.x_value) as sxx,
        sum(p.w * i.x_log_norm * p.x_value) as slx
    from property_ranks as p
    inner join item_ranks as i using (item_key)
    group by p.sample_id, p.b
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
