-- paired_retrieval_counts: per retrieval probe set, the judged queries (items of kind 'query' with a relevant
-- document, as retrieval_per_query.sql scores) that one side of a paired comparison embedded alone.
-- params:  $base_model, $base_release, $other_model, $other_release
-- columns: analysis, probe_set, property (null: every property), n_only_base, n_only_other
with

judged as (
    select distinct probe_set, left_id as item_id
    from probe_relations
    where relation = 'relevant' and value > 0
),

sides as (
    select
        e.probe_set, e.item_id,
        bool_or(e.model = $base_model and e.release = $base_release) as in_base,
        bool_or(e.model = $other_model and e.release = $other_release) as in_other
    from embeddings as e
    inner join judged as j on j.probe_set = e.probe_set and j.item_id = e.item_id
    inner join probe_items as i on i.probe_set = e.probe_set and i.item_id = e.item_id
    where i.kind = 'query'
        and ((e.model = $base_model and e.release = $base_release)
            or (e.model = $other_model and e.release = $other_release))
    group by all
),

final as (
    select
        'retrieval_calibration' as analysis, probe_set, null::varchar as property,
        count_if(in_base and not in_other) as n_only_base,
        count_if(in_other and not in_base) as n_only_other
    from sides
    group by probe_set
)

select * from final
