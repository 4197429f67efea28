-- stg_bootstrap_replicates: the bootstrap replicate statistics of norm_vs_property, one batch of replicates.
-- norm_vs_property_ci takes its intervals from them. pipeline/analysis/sql.py creates a temporary table of this name
-- for one (model, release, seed, resamples), running this query once per batch of replicates
-- $first_resample .. $first_resample + $batch_resamples - 1: a batch's rows grow with its replicates, so
-- batches bound the memory of a large probe set (its statistics do not depend on the batching).
-- Method: Poisson bootstrap, seeded. In replicate b every item gets a weight w ~ Poisson(1) (capped at 10;
-- P(w > 10) = 1e-8) and appears w times in the resample; all properties of a probe set share the replicate's
-- weights, so a replicate is one resample of items. Each replicate statistic is computed as on the full
-- sample, average ranks recomputed over the resample (an item's w copies form one tie group: the same as
-- numpy.repeat then scipy.stats.spearmanr).
-- Weights are reproducible anywhere: u = mix32(mix32((seed * 2654435769 + b) mod 2^32) xor pos), where pos is
-- the item's 0-based position among its probe set's embedded items ordered by item_id, and mix32 is the
-- "lowbias32" integer hash (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16,
-- mod 2^32); w = the number of k in 0..9 with u >= floor(P(Poisson(1) <= k) * 2^32).
-- Cost: a replicate's rows are every item with w > 0. norm is ranked once per item set and replicate (one
-- sort of the batch's replicates on the staged dense rank of norm, an integer); each member row of a sample then
-- meets its item's weight and norm rank in one integer join. A property with few distinct values is summed
-- per value (the value's weight gives its rank, as n_tokens and zipf); one with many is sorted per replicate.
-- A sorted rank is the running weight through its tie group less half the group's weight beyond one: the
-- group's weight is summed apart, and only for the items the staging marks as tied (norm_tied, value_count).
-- Input: bootstrap_replicate_keys (bootstrap_replicate_keys.sql, staged for the batch: the keys above).
-- params:  $first_resample (>= 0), $batch_resamples (>= 1); the scope is that of stg_analysis_values
-- columns: probe_set, property, statistic, b (the replicate), value (null or not finite where undefined)
with

-- one row per (probe set, property): which statistics exist
groups as (
    select
        v.group_key, g.probe_set, g.property, g.set_id, g.set_items, v.n_items, v.n_with_zipf,
        g.property <> 'zipf' and v.n_with_zipf > 0 as has_zipf_control,
        v.has_token_control, v.few_values, v.mean_value, v.mean_value_with_zipf
    from (
        select
            group_key, count(*) as n_items, count(zipf) as n_with_zipf,
            min(n_tokens) < max(n_tokens) as has_token_control,
            avg(value) as mean_value, avg(value) filter (where zipf is not null) as mean_value_with_zipf,
            -- a performance choice only (both rankings below are exact): an estimate of the distinct values will do
            approx_count_distinct(value) * 8 <= count(*) as few_values
        from stg_analysis_values
        group by group_key
    ) as v
    inner join stg_analysis_groups as g using (group_key)
),

-- the samples statistics are computed on. sample_id = 2 * group_id: every item with the property;
-- 2 * group_id + 1: the items that also have a zipf, needed only where some lack one (else the zipf
-- control is computed on the first). A full sample holds every embedded item of its probe set
samples_declared as (
    select *, 2 * group_id as sample_id, false as zipf_only, n_items = set_items as full_sample
    from (select *, row_number() over (order by probe_set, property) as group_id from groups)
    union all
    select *, 2 * group_id + 1, true, false
    from (select *, row_number() over (order by probe_set, property) as group_id from groups)
    where has_zipf_control and n_with_zipf < n_items
),

-- samples with the same item set share the ranks of the item-level variables norm, n_tokens and zipf: full
-- samples are their probe set's item set; the others are told apart by a digest of their items
partial_signatures as (
    select s.sample_id, count(*) as n, sum(hash(v.pos)) as digest
    from stg_analysis_values as v
    inner join samples_declared as s using (group_key)
    where not s.full_sample and (not s.zipf_only or v.zipf is not null)
    group by s.sample_id
),

samples as (
    select
        d.*,
        dense_rank() over (order by d.set_id, coalesce(p.n, d.set_items), coalesce(p.digest, 0)) as item_set_id,
        row_number() over (
            partition by d.set_id, coalesce(p.n, d.set_items), coalesce(p.digest, 0) order by d.sample_id
        ) = 1 as represents_set
    from samples_declared as d
    left join partial_signatures as p using (sample_id)
),

sample_members as not materialized (
    select
        s.sample_id, s.item_set_id, s.represents_set, s.few_values,
        if(s.zipf_only, s.mean_value_with_zipf, s.mean_value) as mean_value,
        v.pos, v.norm, v.n_tokens, v.value, v.zipf, v.d_norm, v.norm_tied, v.d_value, v.value_count
    from stg_analysis_values as v
    inner join samples as s using (group_key)
    where not s.zipf_only or v.zipf is not null
),

item_set_members as not materialized (
    select item_set_id, pos, norm, n_tokens, zipf, d_norm, norm_tied from sample_members where represents_set
),

-- the batch's replicates: b numbers the replicate (its weights hash from it), i its place in the batch (the
-- integer keys below combine it with item set and sample ids)
replicate_keys as (
    select b, b - $first_resample as i, key from bootstrap_replicate_keys
),

-- the rows whose replicate weights are hashed: every item of an item set (its ranks come from them), and the
-- member rows of a many-valued sample whose value another member shares (the weight of their tie group)
weighed as not materialized (
    select false as value_tie, item_set_id as unit_id, pos, n_tokens, zipf, d_norm, norm_tied, null::integer as d_value
    from item_set_members
    union all
    select true, sample_id, pos, null, null, null, null, d_value
    from sample_members
    where not few_values and value_count > 1
),

-- every such row in every replicate, its weight hashed from (replicate key, pos) in place (the hash of each
-- step is its own CTE: a select-list expression naming another alias of the same list is inlined, and would
-- be evaluated once per reference)
mix_0 as not materialized (
    select i.value_tie, i.unit_id * $batch_resamples + r.i as unit_rep, i.pos, i.n_tokens, i.zipf, i.d_norm,
        i.norm_tied, i.d_value, xor(r.key, (i.pos & 4294967295)::ubigint) as h
    from weighed as i cross join replicate_keys as r
),
mix_1 as not materialized (select * replace (xor(h, h >> 16) as h) from mix_0),
mix_2 as not materialized (select * replace ((h * 2146121005) & 4294967295 as h) from mix_1),
mix_3 as not materialized (select * replace (xor(h, h >> 15) as h) from mix_2),
mix_4 as not materialized (select * replace ((h * 2221713035) & 4294967295 as h) from mix_3),
mix_5 as not materialized (select * replace (xor(h, h >> 16) as h) from mix_4),

weights as not materialized (
    select * exclude (h), w
    from (
        select *,
            (h >= 1580030168)::int + (h >= 3160060337)::int + (h >= 3950075421)::int + (h >= 4213413783)::int
            + (h >= 4279248373)::int + (h >= 4292415291)::int + (h >= 4294609777)::int + (h >= 4294923276)::int
            + (h >= 4294962463)::int + (h >= 4294966817)::int as w
        from mix_5
    )
    where w > 0
),

item_rows as not materialized (
    select unit_rep as item_rep, pos, n_tokens, zipf, d_norm, norm_tied, w from weights where not value_tie
),

-- the weight of each group of tied norms in a replicate, over the items that have a tie in their probe set
norm_tie_weights as (
    select item_rep, d_norm, sum(w) as weight from item_rows where norm_tied group by all
),

-- the weight of each group of tied values of a many-valued sample in a replicate
value_tie_weights as (
    select unit_rep as sample_rep, d_value, sum(w) as weight from weights where value_tie group by all
),

-- weight of each (n_tokens, zipf) combination per replicate: sizes, offsets and the counted ranks come from it
cells as (
    select item_rep, n_tokens, zipf, sum(w) as weight from item_rows group by all
),

replicate_sizes as (
    select item_rep, size,
        coalesce(sum(size) over (order by item_rep rows between unbounded preceding and 1 preceding), 0) as offset_
    from (select item_rep, sum(weight) as size from cells group by item_rep)
),

token_ranks as (
    select
        item_rep, n_tokens,
        sum(weight) over (partition by item_rep order by n_tokens rows between unbounded preceding and current row)
            - (weight - 1) / 2.0 as r
    from (select item_rep, n_tokens, sum(weight) as weight from cells group by all)
),

-- per item set: the centre of ln(norm) for the Pearson sums, and whether every item has a zipf to rank
item_set_stats as (
    select item_set_id, avg(ln(norm)) as mean_log_norm, count(zipf) = count(*) as all_have_zipf
    from item_set_members
    group by item_set_id
),

zipf_ranks as (
    select
        item_rep, zipf,
        sum(weight) over (partition by item_rep order by zipf rows between unbounded preceding and current row)
            - (weight - 1) / 2.0 as r
    from (
        select item_rep, zipf, sum(weight) as weight
        from cells
        where item_rep // $batch_resamples in (select item_set_id from item_set_stats where all_have_zipf)
        group by all
    )
),

-- norm's weighted average rank = weight through the tie group - (the group's weight - 1) / 2: one sort of all
-- replicates on the integer key (item_rep, dense norm rank); the running sum runs across replicates, and
-- each replicate's offset (the weight of the replicates before it) is taken off. Only what the sort needs is
-- carried through it. Ranks are centred on their exact mean mid = (size + 1) / 2, so weighted sums of
-- products are central moments; n_tokens and zipf get their counted ranks here too
item_ranks as materialized (
    select
        (r.item_rep // $batch_resamples) * 4294967296 + r.pos as item_pos, (r.item_rep % $batch_resamples)::integer as b, r.w,
        r.through - (coalesce(g.weight, r.w) - 1) / 2.0 - s.offset_ - (s.size + 1) / 2.0 as r_norm,
        t.r - (s.size + 1) / 2.0 as r_tokens,
        z.r - (s.size + 1) / 2.0 as r_zipf
    from (
        select
            item_rep, pos, w, n_tokens, zipf, d_norm,
            sum(w) over (order by item_rep * 4294967296 + d_norm range between unbounded preceding and current row) as through
        from item_rows
    ) as r
    inner join replicate_sizes as s using (item_rep)
    inner join token_ranks as t on t.item_rep = r.item_rep and t.n_tokens = r.n_tokens
    left join zipf_ranks as z on z.item_rep = r.item_rep and z.zipf = r.zipf
    left join norm_tie_weights as g on g.item_rep = r.item_rep and g.d_norm = r.d_norm
),

-- each (sample, replicate): its resample's size (its item set's) and the centre of its ranks
sample_sizes as (
    select
        s.sample_id * $batch_resamples + r.item_rep % $batch_resamples as sample_rep, s.few_values, r.size,
        (r.size + 1) / 2.0 as mid
    from samples as s
    inner join replicate_sizes as r on r.item_rep // $batch_resamples = s.item_set_id
),

member_info as not materialized (
    select
        m.sample_id, m.item_set_id, m.item_set_id * 4294967296 + m.pos as item_pos, m.value, m.d_value,
        m.value - m.mean_value as x_value, m.few_values, ln(m.norm) - c.mean_log_norm as x_log_norm
    from sample_members as m
    inner join item_set_stats as c using (item_set_id)
),

-- each member row of a resample meets its item's weight and ranks: one join on the integer item_pos = item
-- set * 2^32 + position
paired as not materialized (
    select
        m.sample_id * $batch_resamples + i.b as sample_rep, m.few_values, m.value, m.d_value, m.x_value, m.x_log_norm,
        i.w, i.r_norm, i.r_tokens, i.r_zipf
    from member_info as m
    inner join item_ranks as i using (item_pos)
),

-- few distinct values: the rows of a (sample, replicate, value) share the value's rank, so they are summed
-- first; the value's weight in the resample gives its average rank, as for n_tokens
value_cells as (
    select
        sample_rep, value,
        sum(w) as sw, sum(w * r_norm) as sn, sum(w * r_tokens) as st, sum(w * r_zipf) as sz,
        sum(w * r_norm * r_norm) as snn, sum(w * r_norm * r_tokens) as snt,
        sum(w * r_tokens * r_tokens) as stt, sum(w * r_norm * r_zipf) as snz,
        sum(w * r_zipf * r_zipf) as szz,
        sum(w * x_log_norm) as sl, sum(w * x_value) as sx, sum(w * x_log_norm * x_log_norm) as sll,
        sum(w * x_value * x_value) as sxx, sum(w * x_log_norm * x_value) as slx
    from paired
    where few_values
    group by all
),

few_moments as (
    select
        sample_rep,
        sum(sn * r_value) as snv, sum(snn) as snn, sum(sw * r_value * r_value) as svv,
        sum(snt) as snt, sum(st * r_value) as svt, sum(stt) as stt,
        sum(snz) as snz, sum(sz * r_value) as svz, sum(szz) as szz,
        sum(sw) as sw, sum(sl) as sl, sum(sx) as sx, sum(sll) as sll, sum(sxx) as sxx, sum(slx) as slx
    from (
        select c.*,
            sum(c.sw) over (partition by c.sample_rep order by c.value rows between unbounded preceding and current row)
                - (c.sw - 1) / 2.0 - z.mid as r_value
        from value_cells as c
        inner join sample_sizes as z using (sample_rep)
    )
    group by sample_rep
),

-- many distinct values: the resample's rows are sorted by value (the staged dense rank, an integer), as norm
-- above
-- A sample's members are its item set's items, so its resample weighs what its item set's does: the
-- replicates' sizes give each (sample, replicate)'s offset in one sort of them all
many_offsets as (
    select
        sample_rep, mid,
        coalesce(sum(size) over (order by sample_rep rows between unbounded preceding and 1 preceding), 0) as offset_
    from sample_sizes
    where not few_values
),

many_rows as (
    select
        p.w, p.r_norm, p.r_tokens, p.r_zipf, p.x_log_norm, p.x_value, p.sample_rep,
        p.through - (coalesce(g.weight, p.w) - 1) / 2.0 - o.offset_ - o.mid as r_value
    from (
        select
            sample_rep, d_value, w, r_norm, r_tokens, r_zipf, x_log_norm, x_value,
            sum(w) over (order by sample_rep * 4294967296 + d_value range between unbounded preceding and current row) as through
        from paired
        where not few_values
    ) as p
    inner join many_offsets as o using (sample_rep)
    left join value_tie_weights as g on g.sample_rep = p.sample_rep and g.d_value = p.d_value
),

many_moments as (
    select
        sample_rep,
        sum(w * r_norm * r_value) as snv, sum(w * r_norm * r_norm) as snn, sum(w * r_value * r_value) as svv,
        sum(w * r_norm * r_tokens) as snt, sum(w * r_value * r_tokens) as svt, sum(w * r_tokens * r_tokens) as stt,
        sum(w * r_norm * r_zipf) as snz, sum(w * r_value * r_zipf) as svz, sum(w * r_zipf * r_zipf) as szz,
        sum(w) as sw, sum(w * x_log_norm) as sl, sum(w * x_value) as sx,
        sum(w * x_log_norm * x_log_norm) as sll, sum(w * x_value * x_value) as sxx,
        sum(w * x_log_norm * x_value) as slx
    from many_rows
    group by sample_rep
),

moments as (
    select sample_rep // $batch_resamples as sample_id, $first_resample + sample_rep % $batch_resamples as b, *
    from (select * from few_moments union all select * from many_moments)
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

final as (
    select * from replicate_statistics
)

select * from final
