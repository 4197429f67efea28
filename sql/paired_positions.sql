-- paired_positions: a paired comparison's units of one analysis, marked shared (both sides have the unit) or
-- not, with each shared unit's bootstrap position: 0-based among its probe set's shared units ordered by the
-- unit's key (the weights of paired_weights.sql are a function of it).
-- Input: the table named by $units (side, probe_set, unit, ...: one or more rows per side and unit).
-- params:  $units (a table name), $n_sides (2; 1 when a side is compared with itself)
-- columns: the input's, shared, pos (null where not shared)
with

shared_units as (
    select probe_set, unit, row_number() over (partition by probe_set order by unit) - 1 as pos
    from (
        select probe_set, unit
        from query_table($units)
        group by all
        having count(distinct side) = $n_sides
    )
),

final as (
    select u.*, s.pos is not null as shared, s.pos
    from query_table($units) as u
    left join shared_units as s on s.probe_set = u.probe_set and s.unit = u.unit
)

select * from final
