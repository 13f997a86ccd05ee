/*
 * testutil_daemon.h - what the end-to-end tests that run our daemons as processes share
 * (test_ps_daemon.c, test_security.c): starting a daemon with its stderr in a log file,
 * waiting for its --port-file, stopping it, and reading its /metrics or a command's output.
 *
 * Every daemon started through a tu_procs_t is killed by tu_procs_kill_all() (call it from
 * the suite's or the test's fini: it runs even when an assertion ended the test early), and
 * by PR_SET_PDEATHSIG if the test process dies. Criterion runs each test in a process of its
 * own, so a test file keeps one tu_procs_t in a static.
 */
#ifndef MT_TESTUTIL_DAEMON_H
#define MT_TESTUTIL_DAEMON_H

#include <stddef.h>
#include <sys/types.h>

#define TU_PROCS_MAX 16

/* The daemons a test started and has not reaped yet (0: a free or reaped slot). */
typedef struct tu_procs {
    pid_t pid[TU_PROCS_MAX];
    int n;
} tu_procs_t;

/*
 * Starts argv[0] with @p argv (NULL-terminated) in a child process whose stderr goes to
 * @p log, opened with fopen mode @p log_mode ("w" or "a"). Asserts that fork succeeds; a
 * child that cannot open its log exits 126, one that cannot exec exits 127. @returns the pid,
 * remembered in @p p (when a slot is free).
 */
pid_t tu_procs_spawn(tu_procs_t *p, char *const argv[], const char *log, const char *log_mode);

/* Sends @p sig to @p pid, reaps it and forgets it. @returns its wait status (waitpid). */
int tu_procs_stop(tu_procs_t *p, pid_t pid, int sig);

/* Forgets @p pid (the caller reaped it). */
void tu_procs_forget(tu_procs_t *p, pid_t pid);

/* SIGKILLs and reaps every daemon @p p remembers. */
void tu_procs_kill_all(tu_procs_t *p);

/* The positive number in @p path (a daemon's --port-file), polled every 100 ms for up to
 * @p timeout_s. @returns it, or -1. */
int tu_read_port_file(const char *path, int timeout_s);

/* The N of the last "metrics on port N" line of the daemon's log @p log, polled every 100 ms
 * for up to 10 s. @returns it, or -1. */
int tu_metrics_port(const char *log);

/* GET @p path from 127.0.0.1:@p port over HTTP/1.0. @returns the whole answer, headers
 * included (caller frees), or NULL when the connection or the request failed. */
char *tu_http_get(int port, const char *path);

/* Runs the shell command @p cmd, its stdout into @p out (at most @p cap - 1 bytes, NUL
 * terminated). @returns its exit status, or -1 (not started, or killed by a signal). */
int tu_run(const char *cmd, char *out, size_t cap);

#endif /* MT_TESTUTIL_DAEMON_H */
