-- The NVTX step candidates' ranges, in one pass: ranges in the window (per-op ranges left out unless $wanted),
-- each distinct text's clean form, template and number rank (texts), counter families (families), and each range's
-- name (named: the template of a counter family, else its clean text).
-- The start of step_boundaries.NVTX_SQL, which ends named's test of $wanted on letters only (LETTERS).
-- Binds $start, $end, $wanted, $autograd, $per_op, $metadata.
WITH ranges AS (
  SELECT pid, tid, kind, coalesce(depth, 0) AS depth, start_ns, end_ns, text
  FROM nvtx WHERE kind IN ('push_pop', 'start_end') AND end_ns IS NOT NULL AND text IS NOT NULL
    AND start_ns >= $start AND end_ns <= $end
    AND ($wanted IS NOT NULL OR (NOT starts_with(text, 'aten::') AND NOT contains(text, $autograd)
                                 AND NOT regexp_matches(text, $per_op)))),
texts AS (
  SELECT *, dense_rank() OVER (PARTITION BY template ORDER BY list_transform(
         regexp_extract_all(clean, '[0-9]+'), lambda x: lpad(x, 40, '0'))) AS nums
  FROM (SELECT text, clean, regexp_replace(clean, '[0-9]+', 'N', 'g') AS template
        FROM (SELECT text, regexp_replace(text, $metadata, '') AS clean FROM (SELECT DISTINCT text FROM ranges)))),
steps AS MATERIALIZED (
  SELECT r.pid, r.tid, r.kind, r.depth, r.start_ns, r.end_ns, t.clean, t.template, t.nums
  FROM ranges r JOIN texts t USING (text)),
families AS (
  SELECT template, kind, depth, count(DISTINCT clean) > 1 AND bool_and(prev IS NULL OR nums > prev) AS counter
  FROM (SELECT *, lag(nums) OVER (PARTITION BY template, kind, depth, pid, tid ORDER BY start_ns, end_ns) AS prev
        FROM steps)
  GROUP BY ALL),
named AS (
  SELECT * FROM (
    SELECT s.pid, s.tid, s.kind, s.depth, s.start_ns, s.end_ns, f.counter,
           CASE WHEN f.counter THEN s.template ELSE s.clean END AS name
    FROM steps s JOIN families f USING (template, kind, depth))
  WHERE $wanted IS NULL OR name = $wanted OR
