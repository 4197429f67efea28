-- bootstrap_replicate_keys: the hash key of each bootstrap replicate of one batch, from which the replicate's
-- Poisson weights are hashed: key = mix32((seed * 2654435769 + b) mod 2^32), mix32 the "lowbias32" integer hash
-- (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16, mod 2^32).
-- pipeline/analysis/sql.py stages it as a temporary table of this name before each batch of a paired
-- comparison: paired_weights.sql reads it. The audit's own bootstrap (pipeline/analysis/bootstrap.py, whose
-- docstring defines the method) computes the same keys with numpy (replicate_keys).
-- params:  $seed (0 <= seed < 2^32), $first_resample (>= 0), $batch_resamples (>= 1)
-- columns: b (the replicate), key
with

final as (
    select
        b,
        ((($seed::ubigint % 4294967296) * 2654435769 + b::ubigint) % 4294967296)::ubigint as k0,
        xor(k0, k0 >> 16) as k1,
        (k1 * 2146121005) % 4294967296 as k2,
        xor(k2, k2 >> 15) as k3,
        (k3 * 2221713035) % 4294967296 as k4,
        xor(k4, k4 >> 16) as key
    from range($first_resample, $first_resample + $batch_resamples) as t(b)
)

select b, key from final
