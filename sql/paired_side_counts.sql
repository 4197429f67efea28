-- paired_side_counts: per probe set, the units of one analysis that one side of a paired comparison has alone.
-- Input: the table named by $units, as paired_positions.sql returns it.
-- params:  $units (a table name), $analysis
-- columns: analysis, probe_set, property (null: every property of the analysis), n_only_base, n_only_other
with

final as (
    select
        $analysis as analysis, probe_set, null::varchar as property,
        count(distinct unit) filter (where side = 0 and not shared) as n_only_base,
        count(distinct unit) filter (where side = 1 and not shared) as n_only_other
    from query_table($units)
    group by probe_set
)

select * from final
