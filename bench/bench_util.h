/*
 * bench_util.h - what the programs in bench/ share: one JSON object per line, rates and
 * latency samples with their medians and percentiles, the splitmix64 id mixer, sleeps, and
 * the daemons a bench starts (a registry of child processes and a temporary directory, both
 * cleaned up at exit and on SIGINT / SIGTERM / SIGHUP).
 *
 * Output line (mt_bench_emit), read by scripts and by the README's figures; keep its shape:
 *
 *   {"bench":B,"metric":M,"value":V (%.6g),"unit":U[,extra]}
 *
 * Thread safety: everything but the process section is pure or works on the caller's data.
 * The process section keeps one process-wide registry (the children started and not yet
 * reaped, and the temporary directory) as file-statics of bench_util.c: call it from the
 * main thread only (children are forked from it, so PR_SET_PDEATHSIG follows the program's
 * life); the signal handler reads the registry from whichever thread takes the signal.
 */
#ifndef MT_BENCH_UTIL_H
#define MT_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ============================== ids ============================== */

/** The golden-ratio increment of splitmix64 (also a good odd salt multiplier). */
#define MT_BENCH_GOLDEN64 0x9E3779B97F4A7C15ull

/** The splitmix64 finalizer: a bijection of 64-bit values that looks random. */
uint64_t mt_bench_mix64(uint64_t z);

/** The next value of the splitmix64 stream whose state is *@p state (advanced). */
uint64_t mt_bench_splitmix64(uint64_t *state);

/** Uniform in [0, 1) with 53 random bits, from the splitmix64 stream *@p state. */
double mt_bench_rand01(uint64_t *state);

/** mt_bench_rand01() as the callback mt_zipf_next() takes (@p state: a uint64_t *). */
double mt_bench_rand01_cb(void *state);

/* ============================== statistics ============================== */

/** qsort comparator of doubles, ascending. */
int mt_bench_cmp_double(const void *a, const void *b);

/** Sorts v[0..n) ascending. */
void mt_bench_sort(double *v, size_t n);

/** The median v[n / 2] of v[0..n) (sorts it; n > 0). */
double mt_bench_median(double *v, size_t n);

/**
 * The p-quantile of v[0..n), nearest rank v[round(p * (n - 1))] (sorts it).
 * @returns NAN if n is 0.
 */
double mt_bench_pct(double *v, size_t n, double p);

/** Rates of repeated runs (the machine is shared and noisy): median, min, max. */
typedef struct mt_bench_rates {
    double v[32];
    int n;
} mt_bench_rates_t;

/** The median of the runs (sorts r->v: then v[0] is the min, v[n - 1] the max). */
double mt_bench_rates_median(mt_bench_rates_t *r);

/** Appends ,"min":..,"max":..,"reps":.. to @p extra (r sorted by mt_bench_rates_median). */
void mt_bench_rates_append(const mt_bench_rates_t *r, char *extra, size_t len);

/** A growing array of samples (latencies); zero-initialise, free v when done. */
typedef struct mt_bench_samples {
    double *v;
    size_t n, cap;
} mt_bench_samples_t;

/** Appends @p x. @returns 0, or -1 out of memory (s unchanged). */
int mt_bench_samples_push(mt_bench_samples_t *s, double x);

/* ============================== output and time ============================== */

/**
 * Prints one figure as a JSON line and flushes stdout.
 * @param[in] bench  the program's name in the line ("ps", "serving", ...)
 * @param[in] extra  more "key":value pairs without the leading comma; NULL or "" for none
 */
void mt_bench_emit(const char *bench, const char *metric, double value, const char *unit,
                   const char *extra);

/** snprintf at the end of the string in @p buf (of @p len bytes); truncates. */
void mt_bench_appendf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Sleeps @p s seconds, resuming after signals. */
void mt_bench_sleep_s(double s);

/* ============================== conditions ============================== */

/**
 * What a stretch of a run ran under, so that a reader can tell a slow machine from a slow
 * change: wall and CPU time (this process, the children it reaped, and the live children of
 * the registry below), page faults, the machine's CPU taken by others and stolen by the
 * hypervisor (/proc/stat), and the share of memory on transparent huge pages.
 */
typedef struct mt_bench_cond {
    double wall_s, user_s, sys_s;
    double minflt, majflt;
    double io_read, io_write; /* bytes this process read and wrote to storage */
    unsigned long long cpu_busy, cpu_steal, cpu_total; /* /proc/stat jiffies, all CPUs */
} mt_bench_cond_t;

/** Starts a stretch: records the counters now. */
void mt_bench_cond_start(mt_bench_cond_t *c);

/**
 * Appends the stretch since mt_bench_cond_start() to @p extra:
 *   "wall_s", "cpu_s" (user + system of ours), "cpu_user_s", "cpu_sys_s", "minflt",
 *   "majflt", "io_read_mb", "io_write_mb" (this process, /proc/self/io), "others_busy_share" (CPU time of the machine's other processes over its
 *   capacity), "steal_share" (stolen by the hypervisor), and, over this process and its live
 *   children now: "thp_hinted_mb" and "thp_hinted_share" (resident memory of the mappings
 *   that asked for huge pages, MADV_HUGEPAGE: the table's arenas and bucket arrays, and the
 *   share of it on huge pages), "thp_anon_share" (of all anonymous memory).
 */
void mt_bench_cond_append(const mt_bench_cond_t *c, char *extra, size_t len);

/**
 * Emits {"bench":B,"metric":"conditions","value":wall_s,"unit":"s","stage":S,...} with the
 * figures of mt_bench_cond_append(): every bench prints one for its whole run (stage
 * "run"), some also per stage.
 */
void mt_bench_cond_emit(const char *bench, const char *stage, const mt_bench_cond_t *c);

/**
 * Starts the stretch of the whole run: at exit (after main returns or exit(), before the
 * children of the registry are stopped when called after mt_bench_cleanup_install()) the
 * program emits its "conditions" line of stage "run". Main thread only, once.
 */
void mt_bench_run_conditions(const char *bench);

/**
 * Memory of process @p pid (0: this one) from /proc/PID/smaps: resident bytes and bytes on
 * huge pages of the mappings that asked for huge pages (VmFlags hg), and of all anonymous
 * memory. @returns 0, or -1 (smaps unreadable: all four are 0).
 */
int mt_bench_thp(pid_t pid, uint64_t *hinted_rss, uint64_t *hinted_huge, uint64_t *anon,
                 uint64_t *anon_huge);

/**
 * Maps @p bytes (rounded up to 2 MiB, aligned to 2 MiB) straight from the kernel and asks
 * for transparent huge pages on them, as the table does for its arenas: the floor of a
 * comparison runs on the same kind of pages. @returns NULL out of memory.
 */
void *mt_bench_alloc_huge(size_t bytes);

/** Unmaps what mt_bench_alloc_huge(@p bytes) returned (NULL: nothing). */
void mt_bench_free_huge(void *p, size_t bytes);

/* ============================== processes (main thread only) ============================== */

/** Children the registry holds at once. */
#define MT_BENCH_MAX_CHILDREN 16

/**
 * Creates the temporary directory /tmp/@p name-XXXXXX, removed (rm -rf) at exit or on a
 * signal once mt_bench_cleanup_install() ran.
 * @returns its path (valid until the program ends), or NULL with errno set.
 */
const char *mt_bench_root_create(const char *name);

/** The directory of mt_bench_root_create() ("" before it). */
const char *mt_bench_root(void);

/**
 * Kills (SIGKILL) and reaps every registered child and removes the temporary directory at
 * exit and on SIGINT, SIGTERM and SIGHUP (the handler then exits with 128 + the signal);
 * ignores SIGPIPE (a dead peer is an error from a call, not a signal).
 */
void mt_bench_cleanup_install(void);

/**
 * Starts argv[0] (PATH search) with stdout and stderr appended to @p log_path, signals at
 * their defaults, and PR_SET_PDEATHSIG SIGKILL (killed if this program dies, even by
 * SIGKILL); registers it for the clean-up.
 * @returns its pid, or -1 (fork failed, or the registry is full).
 */
pid_t mt_bench_spawn(char *const argv[], const char *log_path);

/** 1 if child @p pid has exited (then reaped and forgotten, wait status in *ws), else 0. */
int mt_bench_child_exited(pid_t pid, int *ws);

/** Sends @p sig, waits up to 10 s, then SIGKILL. @returns the wait status (-1 if killed). */
int mt_bench_child_stop(pid_t pid, int sig);

/**
 * Waits up to @p timeout_s for child @p pid to write its port (a decimal number) to
 * @p port_path. Prints nothing.
 * @param[out] ws  the wait status if the child exited first (0 otherwise); may be NULL
 * @returns the port, or -1 (the child exited, or time ran out)
 */
int mt_bench_wait_port(const char *port_path, pid_t pid, double timeout_s, int *ws);

/** User + system CPU seconds of live process @p pid so far (/proc/PID/stat, clock ticks:
 *  10 ms steps). @returns them, or -1 (unreadable). */
double mt_bench_pid_cpu_s(pid_t pid);

/** Copies the last 20 lines of the log at @p path to stderr. */
void mt_bench_log_tail(const char *path);

#endif /* MT_BENCH_UTIL_H */
