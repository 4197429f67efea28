-- claims_items: the items of one probe set a claim of the claims table tests, in long form: each embedded item
-- (of one kind, or all) with its norm and token count, and the value of each property it has. The claims
-- table (pipeline/analysis/claims.py) pivots it and correlates norm with a property given its controls.
-- params:  $model, $release, $probe_set, $kind ('' = every kind)
-- columns: item_id, norm, n_tokens, property, value (property null for an item without any)
with

embedded as (
    select e.item_id, e.norm, e.n_tokens
    from embeddings as e
    inner join probe_items as i on i.probe_set = e.probe_set and i.item_id = e.item_id
    where e.model = $model and e.release = $release and e.probe_set = $probe_set
        and ($kind = '' or i.kind = $kind)
),

properties as (
    select item_id, property, value
    from probe_properties
    where probe_set = $probe_set and value is not null and isfinite(value)
),

final as (
    select e.item_id, e.norm, e.n_tokens, p.property, p.value
    from embedded as e
    left join properties as p on p.item_id = e.item_id
)

select * from final
order by item_id, property
