-- report_density: the items of one probe set in a plot of norm against a property, counted on a grid of
-- $cells x $cells cells spanning [$x0, $x1] x [$y0, $y1] (report_extents), so that a density plot of any number
-- of items is drawn from the counts (each at its cell's centre) without reading every item into the report.
-- The range is bound as numbers, not joined in: a join of it beside the items' join made DuckDB run out of its
-- memory limit at 10 M items, where the items' join alone spills.
-- params:  $model, $release, $property, $probe_set, $cells (cells per axis, e.g. 512), $x0, $x1, $y0, $y1
-- columns: x, y (a cell's centre: property, norm), items (in it)
with

-- a cell's index along each axis; the maximum belongs to the last cell, a constant axis has one cell
cells as (
    select
        coalesce(least(floor((p.value - $x0) / nullif($x1 - $x0, 0) * $cells), $cells - 1), 0) as i,
        coalesce(least(floor((e.norm - $y0) / nullif($y1 - $y0, 0) * $cells), $cells - 1), 0) as j
    from embeddings as e
    inner join probe_properties as p on p.probe_set = e.probe_set and p.item_id = e.item_id
    where e.model = $model and e.release = $release and e.probe_set = $probe_set
        and p.property = $property and p.probe_set = $probe_set and p.value is not null
),

counts as (
    select i, j, count(*) as items
    from cells
    group by i, j
),

final as (
    select
        $x0 + (i + 0.5) * ($x1 - $x0) / $cells as x,
        $y0 + (j + 0.5) * ($y1 - $y0) / $cells as y,
        items
    from counts
)

select * from final
order by x, y
