-- stg_analysis_groups: the (probe set, property) pairs of a release's probe sets, by integer key.
-- stg_analysis_values keys its rows by group_key alone (strings in 30 million staged rows cost more to write
-- and sort than the whole lookup); the analyses take the names from here.
-- pipeline/analysis/sql.py creates it as a temporary table of this name, like stg_analysis_values; the probe sets
-- and their sizes come from stg_release_sets, staged before it for the same scope.
-- params:  none of its own (its scope is stg_release_sets')
-- columns: group_key (hash(probe_set, property), as in stg_analysis_values), probe_set, property,
--          set_id (numbering the probe sets in name order), set_items (embedded items of the probe set)
with

probe_sets as (
    select probe_set, n_embedded as set_items, row_number() over (order by probe_set) as set_id
    from stg_release_sets
),

final as (
    select hash(p.probe_set, p.property) as group_key, p.probe_set, p.property, s.set_id, s.set_items
    from (select distinct probe_set, property from probe_properties where value is not null) as p
    inner join probe_sets as s using (probe_set)
)

select * from final
