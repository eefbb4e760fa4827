-- How the program moves its data: managed (unified) memory in use (managed allocation calls, managed copies and
-- migrations, page faults, managed allocations recorded) and copies between host and device memory that the program
-- asked for (H2D/D2H copies of memory that is not managed).
SELECT (SELECT count(*) FROM cuda_api WHERE kind = 'alloc' AND name ILIKE '%managed%')
     + (SELECT count(*) FROM memcpy WHERE direction LIKE 'UVM%' OR src_kind LIKE 'managed%'
                                          OR dst_kind LIKE 'managed%')
     + (SELECT count(*) FROM uvm_faults)
     + (SELECT count(*) FROM memory_usage WHERE mem_kind LIKE 'managed%' AND operation = 'allocation'),
       (SELECT count(*) FROM memcpy WHERE direction IN ('H2D', 'D2H') AND src_kind NOT LIKE 'managed%'
                                          AND dst_kind NOT LIKE 'managed%')
