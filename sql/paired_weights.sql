-- paired_weights: the Poisson bootstrap weights of a paired comparison's units, for one batch of replicates.
-- The same weights as the audit's bootstrap (pipeline/analysis/bootstrap.py defines them): replicate b gives
-- the unit at 0-based position pos (among its probe set's shared units, ordered by the unit's key) the weight
-- w = the number of k in 0..9 with u >= floor(P(Poisson(1) <= k) * 2^32), u = mix32(mix32((seed * 2654435769
-- + b) mod 2^32) xor pos), mix32 the lowbias32 hash. Weights depend on (seed, b, pos) alone, so both sides of
-- a comparison, and every probe set, read the same rows: one table of positions 0 .. $n_positions - 1.
-- Input: bootstrap_replicate_keys (bootstrap_replicate_keys.sql, staged for the batch's replicates)
-- params:  $n_positions (>= 1)
-- columns: b, pos, w (rows with w = 0 left out)
with

-- each step of the hash is its own CTE (a select-list alias naming another is inlined, evaluated per reference)
mix_0 as (
    select r.b, p.pos, xor(r.key, (p.pos & 4294967295)::ubigint) as h
    from bootstrap_replicate_keys as r
    cross join range($n_positions) as p(pos)
),
mix_1 as (select b, pos, xor(h, h >> 16) as h from mix_0),
mix_2 as (select b, pos, (h * 2146121005) & 4294967295 as h from mix_1),
mix_3 as (select b, pos, xor(h, h >> 15) as h from mix_2),
mix_4 as (select b, pos, (h * 2221713035) & 4294967295 as h from mix_3),
mix_5 as (select b, pos, xor(h, h >> 16) as h from mix_4),

final as (
    select b, pos, w
    from (
        select
            b, pos,
            (h >= 1580030168)::int + (h >= 3160060337)::int + (h >= 3950075421)::int + (h >= 4213413783)::int
            + (h >= 4279248373)::int + (h >= 4292415291)::int + (h >= 4294609777)::int + (h >= 4294923276)::int
            + (h >= 4294962463)::int + (h >= 4294966817)::int as w
        from mix_5
    )
    where w > 0
)

select * from final
