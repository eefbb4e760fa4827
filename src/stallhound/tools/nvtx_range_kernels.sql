-- The kernels each NVTX range launched: launches joined to the ranges of their thread through fine and coarse time
-- buckets (hits), summed per range (per: count, GPU time, span), then per text and depth (g).
-- The middle of nvtx_breakdown.SQL: after the narrow ranges r, up to g's ranges with text (RANGES follows).
-- Binds $devices, $fine, $coarse.
k AS (SELECT (pid << 24) | tid AS th, launch_start_ns AS ls, start_ns, end_ns, unnest([0, 1]) AS back
      FROM kernels WHERE tid IS NOT NULL AND device_id IN (SELECT unnest($devices))),
kf AS (SELECT th, ls, start_ns, end_ns, ls // $fine - back AS bucket FROM k),
kc AS (SELECT th, ls, start_ns, end_ns, ls // $coarse - back AS bucket FROM k),
r0 AS (SELECT rid, th, start_ns, end_ns, start_ns // $fine AS bucket FROM r WHERE d <= $fine),
r1 AS (SELECT rid, th, start_ns, end_ns, start_ns // $coarse AS bucket FROM r WHERE d > $fine AND d <= $coarse),
r2 AS (SELECT rid, th, start_ns, end_ns, unnest(range(start_ns // $coarse, end_ns // $coarse + 1)) AS bucket
       FROM r WHERE d > $coarse),
hits AS (
  SELECT x.rid, k.start_ns, k.end_ns FROM kf k JOIN r0 x USING (th, bucket) WHERE k.ls >= x.start_ns AND k.ls < x.end_ns
  UNION ALL SELECT x.rid, k.start_ns, k.end_ns FROM kc k JOIN r1 x USING (th, bucket)
  WHERE k.ls >= x.start_ns AND k.ls < x.end_ns
  UNION ALL SELECT x.rid, k.start_ns, k.end_ns FROM kc k JOIN r2 x USING (th, bucket)
  WHERE k.ls >= x.start_ns AND k.ls < x.end_ns AND k.ls // $coarse = x.bucket),
per AS (SELECT rid, count(*) AS n, sum(end_ns - start_ns) AS gpu, max(end_ns) - min(start_ns) AS span
        FROM hits GROUP BY rid),
g AS (
  SELECT text, depth, count(*) AS n, sum(end_ns - start_ns) AS cpu, coalesce(sum(p.n), 0) AS kn,
         coalesce(sum(p.gpu), 0) AS gpu, coalesce(sum(p.span), 0) AS span
  FROM (SELECT rowid AS rid, text, depth, start_ns, end_ns
