-- The kernels of a window's work, on $devices: with $by_launch (a window of steps, timed on the host), those whose
-- launch call began in [$lo, $hi) (their GPU start when no launch call was recorded), so a GPU that runs behind its
-- host keeps the work its steps launched; else (a window timed on the GPU) those whose GPU start is in it. Per
-- device and demangled name: its short name, launches and kernel time.
SELECT device_id, coalesce(name, short_name, '') AS name, coalesce(short_name, name, '') AS short_name,
       count(*) AS launches, sum(duration_ns)::BIGINT AS kernel_ns
FROM (SELECT *, CASE WHEN $by_launch THEN coalesce(launch_start_ns, start_ns) ELSE start_ns END AS placed_ns FROM kernels)
WHERE placed_ns >= $lo AND placed_ns < $hi AND device_id IN (SELECT unnest($devices))
GROUP BY ALL ORDER BY kernel_ns DESC, name, device_id
