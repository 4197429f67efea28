-- report_inventory: what one release has stored, per probe set, for the report's header.
-- params:  $model, $release
-- columns: probe_set, items, mean_norm, min_norm, max_norm, truncated_share, mean_n_tokens
with

embeddings_in_scope as (
    select probe_set, norm, n_tokens, truncated
    from embeddings
    where model = $model and release = $release
),

final as (
    select
        probe_set,
        count(*) as items,
        avg(norm) as mean_norm,
        min(norm) as min_norm,
        max(norm) as max_norm,
        avg(truncated::int) as truncated_share,
        avg(n_tokens) as mean_n_tokens
    from embeddings_in_scope
    group by probe_set
)

select * from final
order by probe_set
