-- The process that did the most GPU work (kernels, copies, memsets, graph launches, CUDA calls; ties: lowest pid),
-- its name (NULL without a process table), and whether the profile has any such work. One row, also without any.
WITH work AS (SELECT pid FROM kernels UNION ALL SELECT pid FROM memcpy UNION ALL SELECT pid FROM memset
              UNION ALL SELECT pid FROM graph_exec UNION ALL SELECT pid FROM cuda_api),
top AS (SELECT pid FROM work GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1)
SELECT t.pid, (SELECT any_value(name) FROM processes p WHERE p.pid = t.pid), (SELECT count(*) FROM work) > 0
FROM (SELECT 1) one LEFT JOIN top t ON true
