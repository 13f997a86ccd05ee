/*
 * process.h - the process metrics every daemon exports on /metrics, under the names
 * Prometheus' own clients use (so that dashboards and rules written for any service work):
 *
 *   process_resident_memory_bytes   gauge    resident memory (/proc/self/statm)
 *   process_virtual_memory_bytes    gauge    virtual memory
 *   process_cpu_seconds_total       counter  user + system CPU time (getrusage)
 *   process_open_fds                gauge    open file descriptors (/proc/self/fd)
 *   process_start_time_seconds      gauge    Unix time the process started (the caller's)
 *
 * Thread safety: reentrant (reads /proc and the caller's buffer only).
 */
#ifndef MT_PROCESS_H
#define MT_PROCESS_H

#include <stddef.h>

/**
 * Writes the metrics above as Prometheus text into @p buf (NUL-terminated, cut to @p len;
 * @p len 0: nothing written). A figure /proc does not give is left out.
 * @param start_unix_s  when the process started (time(NULL) at the top of main)
 * @returns the length it needed (as snprintf), or -1 on an output error.
 */
int mt_process_render_metrics(double start_unix_s, char *buf, size_t len);

#endif /* MT_PROCESS_H */
