-- Per device of $devices with kernels, how many kernels ran over the capture, of how many names, and how many times
-- the most repeated name ran (a template's instantiations count as one name: short_name).
SELECT device_id, count(*) AS kernels, count(DISTINCT coalesce(short_name, name, '')) AS names,
       max(runs) AS most_runs
FROM (SELECT device_id, short_name, name,
             count(*) OVER (PARTITION BY device_id, coalesce(short_name, name, '')) AS runs
      FROM kernels WHERE device_id IN (SELECT unnest($devices)))
GROUP BY device_id
