-- What the launching process was inside during the pieces of long gaps the attribution leaves unexplained (pieces:
-- device, pid, start, end, at_edge, bound as lists): its CUDA calls on any of its threads but synchronize calls (a
-- thread waiting on the GPU while it idles is not what keeps it idle), and its ranges
-- (NVTX, a framework's operators; idle_bubbles keeps those that launched no GPU work), each clipped to the piece.
-- Events meet pieces in buckets of $bucket_ns (an equality join: a range join hashed every call against every piece), each pair
-- once, in the bucket where their overlap begins.
-- Binds $devices, $pids, $starts, $ends, $edges, $bucket_ns.
WITH pieces AS (
  SELECT unnest($devices) AS device_id, unnest($pids) AS pid, unnest($starts) AS start_ns, unnest($ends) AS end_ns,
         unnest($edges) AS at_edge),
piece_buckets AS (
  SELECT *, unnest(range(start_ns // $bucket_ns, (end_ns - 1) // $bucket_ns + 1)) AS bucket FROM pieces),
keys AS (SELECT DISTINCT pid, bucket FROM piece_buckets),
calls AS (
  SELECT * FROM (SELECT a.pid, a.tid, a.name, a.kind, a.start_ns, a.end_ns,
                        unnest(range(a.start_ns // $bucket_ns, (a.end_ns - 1) // $bucket_ns + 1)) AS bucket
                 FROM cuda_api a WHERE a.pid IN (SELECT pid FROM pieces) AND a.end_ns > a.start_ns AND a.kind <> 'sync'
                   AND a.end_ns > (SELECT min(start_ns) FROM pieces) AND a.start_ns < (SELECT max(end_ns) FROM pieces))
  WHERE (pid, bucket) IN (SELECT (pid, bucket) FROM keys)),
ranges AS (
  SELECT * FROM (SELECT n.pid, n.tid, n.text AS name, n.start_ns, n.end_ns,
                        unnest(range(n.start_ns // $bucket_ns, (n.end_ns - 1) // $bucket_ns + 1)) AS bucket
                 FROM nvtx n WHERE n.pid IN (SELECT pid FROM pieces) AND n.end_ns > n.start_ns
                   AND n.end_ns > (SELECT min(start_ns) FROM pieces) AND n.start_ns < (SELECT max(end_ns) FROM pieces))
  WHERE (pid, bucket) IN (SELECT (pid, bucket) FROM keys)),
events AS (
  SELECT 'call' AS what, pid, tid, name, start_ns, end_ns, bucket FROM calls
  UNION ALL
  SELECT 'range', pid, tid, name, start_ns, end_ns, bucket FROM ranges)
SELECT p.device_id, p.at_edge, e.what, e.pid, e.tid, e.name, e.start_ns, e.end_ns, greatest(e.start_ns, p.start_ns) AS s,
       least(e.end_ns, p.end_ns) AS e
FROM piece_buckets p JOIN events e ON e.pid = p.pid AND e.bucket = p.bucket
WHERE e.start_ns < p.end_ns AND e.end_ns > p.start_ns AND p.bucket = greatest(e.start_ns, p.start_ns) // $bucket_ns
