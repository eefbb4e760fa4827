-- Per device, the launch calls of the kernels starting in the window (each call once) and those kernels' time, as
-- kernel_launch_overhead's launch_api_ns and launched_kernel_ns.
-- Binds $devices, $start, $end.
SELECT device_id, sum(api_ns)::BIGINT, sum(gpu_ns)::BIGINT FROM (
  SELECT device_id, any_value(launch_end_ns - launch_start_ns) AS api_ns, sum(duration_ns) AS gpu_ns FROM kernels
  WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end AND launch_end_ns IS NOT NULL
  GROUP BY device_id, pid, correlation_id)
GROUP BY device_id
