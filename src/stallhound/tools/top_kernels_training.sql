-- Whether the program trains, from what only training records: torch.optim's ranges ('Optimizer.step#AdamW.step'),
-- autograd's backward ops ('AddmmBackward0', 'autograd::engine::evaluate_function: ...') or an optimizer's kernels
-- (multi_tensor_apply, fused Adam; 'adam' as a word, not inside 'hadamard'). Anywhere in the trace: the optimizer of
-- a step may lie outside the window. Matched once per distinct text (a trace repeats a few names millions of times;
-- as an aggregate over the distinct names, since DuckDB pushes a filter below DISTINCT and would match every row).
SELECT coalesce((SELECT bool_or(regexp_matches(text, '^Optimizer\.|[a-z]Backward[0-9]|^autograd::engine::'))
                 FROM (SELECT DISTINCT text FROM nvtx)), false)
    OR coalesce((SELECT bool_or(regexp_matches(
                   n, '(?i)multi_tensor_apply|fused_?adam|fusedoptimizer|_adam|(^|[^a-z])adamw?([^a-z]|$)'))
                 FROM (SELECT DISTINCT coalesce(name, short_name, '') AS n FROM kernels)), false)
