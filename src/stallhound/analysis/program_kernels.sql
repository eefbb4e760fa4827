-- Kernel families ($labels, $patterns, $excludes: RE2 on the demangled name, else the short name) with at least
-- $min kernels: label, kernels, share of all kernel time (0 when no kernel has a duration). A kernel may belong to
-- several families. Most kernels first, ties in the order of $labels.
WITH names AS (SELECT coalesce(name, short_name, '') AS n, count(*) AS c, sum(duration_ns) AS ns FROM kernels
               GROUP BY 1),
rules AS (SELECT unnest($labels) AS label, unnest($patterns) AS pattern, unnest($excludes) AS exclude,
                 generate_subscripts($labels, 1) AS rank)
SELECT label, sum(c)::BIGINT, coalesce(sum(ns) / nullif((SELECT sum(ns) FROM names), 0), 0)::DOUBLE
FROM names JOIN rules ON regexp_matches(n, pattern) AND NOT coalesce(regexp_matches(n, exclude), false)
GROUP BY label, rank HAVING sum(c) >= $min ORDER BY 2 DESC, rank
