/*
 * bench_util.c - the helpers shared by the programs in bench/ (see bench_util.h).
 *
 * The process registry below is the one piece of mutable state: process-wide, written by the
 * main thread only, read by the atexit hook and by the signal handler. The handler uses
 * async-signal-safe calls only (kill, waitpid, fork, execl, _exit).
 */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mt/clock.h"

/* ============================== ids ============================== */

uint64_t mt_bench_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t mt_bench_splitmix64(uint64_t *state) {
    return mt_bench_mix64(*state += MT_BENCH_GOLDEN64);
}

double mt_bench_rand01(uint64_t *state) {
    return (double)(mt_bench_splitmix64(state) >> 11) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

double mt_bench_rand01_cb(void *state) {
    return mt_bench_rand01(state);
}

/* ============================== statistics ============================== */

int mt_bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void mt_bench_sort(double *v, size_t n) {
    qsort(v, n, sizeof(double), mt_bench_cmp_double);
}

double mt_bench_median(double *v, size_t n) {
    mt_bench_sort(v, n);
    return v[n / 2];
}

double mt_bench_pct(double *v, size_t n, double p) {
    if (!n) return NAN;
    mt_bench_sort(v, n);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

double mt_bench_rates_median(mt_bench_rates_t *r) {
    return mt_bench_median(r->v, (size_t)r->n);
}

void mt_bench_rates_append(const mt_bench_rates_t *r, char *extra, size_t len) {
    mt_bench_appendf(extra, len, ",\"min\":%.6g,\"max\":%.6g,\"reps\":%d", r->v[0], r->v[r->n - 1],
                     r->n);
}

int mt_bench_samples_push(mt_bench_samples_t *s, double x) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        double *v = realloc(s->v, cap * sizeof(double));
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

/* ============================== output and time ============================== */

void mt_bench_emit(const char *bench, const char *metric, double value, const char *unit,
                   const char *extra) {
    printf("{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"%s%s}\n", bench,
           metric, value, unit, extra && *extra ? "," : "", extra ? extra : "");
    fflush(stdout);
}

void mt_bench_appendf(char *buf, size_t len, const char *fmt, ...) {
    size_t l = strlen(buf);
    if (l >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, len - l, fmt, ap);
    va_end(ap);
}

void mt_bench_sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* ============================== processes ============================== */

/* Everything this program started and has not reaped, and its temporary directory: the
 * atexit hook and the signal handler stop and remove them. Main thread only (see above). */
static volatile pid_t g_children[MT_BENCH_MAX_CHILDREN];
static char g_root[128];

static void forget_child(pid_t pid) {
    for (int i = 0; i < MT_BENCH_MAX_CHILDREN; i++)
        if (g_children[i] == pid) g_children[i] = 0;
}

/* rm -rf g_root with fork/exec only: usable from the signal handler. */
static void remove_root(void) {
    if (!g_root[0]) return;
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/rm", "rm", "-rf", g_root, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
    g_root[0] = 0;
}

static void kill_children(void) {
    for (int i = 0; i < MT_BENCH_MAX_CHILDREN; i++) {
        pid_t pid = g_children[i];
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            g_children[i] = 0;
        }
    }
}

static void cleanup_at_exit(void) {
    kill_children();
    remove_root();
}

static void on_signal(int sig) {
    kill_children();
    remove_root();
    _exit(128 + sig);
}

const char *mt_bench_root_create(const char *name) {
    int n = snprintf(g_root, sizeof(g_root), "/tmp/%s-XXXXXX", name);
    if (n < 0 || (size_t)n >= sizeof(g_root)) {
        g_root[0] = 0;
        errno = ENAMETOOLONG;
        return NULL;
    }
    if (!mkdtemp(g_root)) {
        g_root[0] = 0;
        return NULL;
    }
    return g_root;
}

const char *mt_bench_root(void) {
    return g_root;
}

void mt_bench_cleanup_install(void) {
    atexit(cleanup_at_exit);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

pid_t mt_bench_spawn(char *const argv[], const char *log_path) {
    int slot = -1;
    for (int i = 0; i < MT_BENCH_MAX_CHILDREN && slot < 0; i++)
        if (!g_children[i]) slot = i;
    if (slot < 0) return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1); /* the bench died before prctl */
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    g_children[slot] = pid;
    return pid;
}

int mt_bench_child_exited(pid_t pid, int *ws) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
        forget_child(pid);
        if (ws) *ws = st;
        return 1;
    }
    return 0;
}

int mt_bench_child_stop(pid_t pid, int sig) {
    int ws = 0;
    kill(pid, sig);
    for (int i = 0; i < 200; i++) {
        if (mt_bench_child_exited(pid, &ws)) return ws;
        mt_bench_sleep_s(0.05);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    forget_child(pid);
    return -1;
}

static int read_port_file(const char *path) {
    FILE *f = fopen(path, "r");
    int v = 0;
    if (!f) return 0;
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
    return v;
}

int mt_bench_wait_port(const char *port_path, pid_t pid, double timeout_s, int *ws) {
    double t0 = mt_mono_s();
    if (ws) *ws = 0;
    for (;;) {
        int port = read_port_file(port_path);
        if (port > 0) return port;
        if ((pid > 0 && mt_bench_child_exited(pid, ws)) || mt_mono_s() - t0 > timeout_s) return -1;
        mt_bench_sleep_s(0.02);
    }
}

void mt_bench_log_tail(const char *path) {
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "tail -n 20 '%s' >&2", path);
    int rc = system(cmd);
    (void)rc;
}

/* ============================== conditions ============================== */

/* Jiffies of all CPUs from the first line of /proc/stat: busy (user, nice, system, irq,
 * softirq), stolen, and the total with idle and iowait. */
static void read_proc_stat(unsigned long long *busy, unsigned long long *steal,
                           unsigned long long *total) {
    unsigned long long v[8] = {0};
    *busy = *steal = *total = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8) return;
    *busy = v[0] + v[1] + v[2] + v[5] + v[6];
    *steal = v[7];
    *total = *busy + v[3] + v[4] + v[7];
}

/* utime + stime (s) and faults of a live process, from /proc/PID/stat. @returns 0 or -1. */
static int read_pid_stat(pid_t pid, double *user, double *sys, double *minflt, double *majflt) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long mn, mj, ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %lu %*u %lu %*u %lu %lu", &mn, &mj, &ut,
                     &st) != 4)
        return -1;
    double hz = (double)sysconf(_SC_CLK_TCK);
    *user += (double)ut / hz;
    *sys += (double)st / hz;
    *minflt += (double)mn;
    *majflt += (double)mj;
    return 0;
}

double mt_bench_pid_cpu_s(pid_t pid) {
    double u = 0, sy = 0, mn = 0, mj = 0;
    return read_pid_stat(pid, &u, &sy, &mn, &mj) ? -1 : u + sy;
}

/* Bytes this process made storage read and write (/proc/self/io; 0 where unreadable). */
static void read_io(double *rd, double *wr) {
    char line[128];
    unsigned long long v;
    *rd = *wr = 0;
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "read_bytes: %llu", &v) == 1) *rd = (double)v;
        if (sscanf(line, "write_bytes: %llu", &v) == 1) *wr = (double)v;
    }
    fclose(f);
}

/* CPU and faults of this process, its reaped children and the live ones of the registry. */
static void read_usage(mt_bench_cond_t *c) {
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    c->user_s = (double)self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 +
                (double)kids.ru_utime.tv_sec + kids.ru_utime.tv_usec / 1e6;
    c->sys_s = (double)self.ru_stime.tv_sec + self.ru_stime.tv_usec / 1e6 +
               (double)kids.ru_stime.tv_sec + kids.ru_stime.tv_usec / 1e6;
    c->minflt = (double)self.ru_minflt + (double)kids.ru_minflt;
    c->majflt = (double)self.ru_majflt + (double)kids.ru_majflt;
    read_io(&c->io_read, &c->io_write);
    for (int i = 0; i < MT_BENCH_MAX_CHILDREN; i++)
        if (g_children[i] > 0)
            (void)read_pid_stat(g_children[i], &c->user_s, &c->sys_s, &c->minflt, &c->majflt);
}

void mt_bench_cond_start(mt_bench_cond_t *c) {
    memset(c, 0, sizeof(*c));
    c->wall_s = mt_mono_s();
    read_usage(c);
    read_proc_stat(&c->cpu_busy, &c->cpu_steal, &c->cpu_total);
}

int mt_bench_thp(pid_t pid, uint64_t *hinted_rss, uint64_t *hinted_huge, uint64_t *anon,
                 uint64_t *anon_huge) {
    *hinted_rss = *hinted_huge = *anon = *anon_huge = 0;
    char path[64], line[512];
    if (pid)
        snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
    else
        snprintf(path, sizeof(path), "/proc/self/smaps");
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    /* One mapping is a header line, "Key: N kB" lines, and VmFlags last. */
    uint64_t rss = 0, huge = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long kb;
        if (sscanf(line, "Rss: %llu kB", &kb) == 1) {
            rss = kb << 10;
        } else if (sscanf(line, "Anonymous: %llu kB", &kb) == 1) {
            *anon += kb << 10;
        } else if (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) {
            huge = kb << 10;
            *anon_huge += huge;
        } else if (!strncmp(line, "VmFlags:", 8)) {
            if (strstr(line, " hg")) {
                *hinted_rss += rss;
                *hinted_huge += huge;
            }
            rss = huge = 0;
        }
    }
    fclose(f);
    return 0;
}

void mt_bench_cond_append(const mt_bench_cond_t *c, char *extra, size_t len) {
    mt_bench_cond_t now;
    memset(&now, 0, sizeof(now));
    now.wall_s = mt_mono_s();
    read_usage(&now);
    read_proc_stat(&now.cpu_busy, &now.cpu_steal, &now.cpu_total);
    double wall = now.wall_s - c->wall_s, user = now.user_s - c->user_s, sys = now.sys_s - c->sys_s;
    double total = (double)(now.cpu_total - c->cpu_total);
    double hz = (double)sysconf(_SC_CLK_TCK);
    double busy = (double)(now.cpu_busy - c->cpu_busy) / hz, ours = user + sys;
    double others = busy > ours ? busy - ours : 0;
    double cap = total > 0 ? total / hz : 0;
    mt_bench_appendf(extra, len,
                     "%s\"wall_s\":%.3f,\"cpu_s\":%.3f,\"cpu_user_s\":%.3f,\"cpu_sys_s\":%.3f,"
                     "\"minflt\":%.0f,\"majflt\":%.0f,\"io_read_mb\":%.1f,\"io_write_mb\":%.1f,"
                     "\"others_busy_share\":%.3f,\"steal_share\":%.3f",
                     extra[0] ? "," : "", wall, ours, user, sys, now.minflt - c->minflt,
                     now.majflt - c->majflt, (now.io_read - c->io_read) / 1048576.0,
                     (now.io_write - c->io_write) / 1048576.0, cap > 0 ? others / cap : 0,
                     total > 0 ? (double)(now.cpu_steal - c->cpu_steal) / total : 0);
    uint64_t hr = 0, hh = 0, an = 0, ah = 0;
    if (mt_bench_thp(0, &hr, &hh, &an, &ah) == 0) {
        for (int i = 0; i < MT_BENCH_MAX_CHILDREN; i++) {
            uint64_t a, b, d, e;
            if (g_children[i] > 0 && mt_bench_thp(g_children[i], &a, &b, &d, &e) == 0) {
                hr += a;
                hh += b;
                an += d;
                ah += e;
            }
        }
        mt_bench_appendf(
            extra, len, ",\"thp_hinted_mb\":%.1f,\"thp_hinted_share\":%.3f,\"thp_anon_share\":%.3f",
            (double)hr / 1048576.0, hr ? (double)hh / (double)hr : 0,
            an ? (double)ah / (double)an : 0);
    }
}

void mt_bench_cond_emit(const char *bench, const char *stage, const mt_bench_cond_t *c) {
    char extra[640];
    snprintf(extra, sizeof(extra), "\"stage\":\"%s\"", stage);
    mt_bench_cond_append(c, extra, sizeof(extra));
    mt_bench_emit(bench, "conditions", mt_mono_s() - c->wall_s, "s", extra);
}

/* 2 MiB, the size of a transparent huge page on x86-64. */
#define HUGE_PAGE ((size_t)2 << 20)

/* The run's stretch, emitted at exit (process-wide, like the registry above). */
static mt_bench_cond_t g_run_cond;
static const char *g_run_bench;

static void emit_run_conditions(void) {
    if (g_run_bench) mt_bench_cond_emit(g_run_bench, "run", &g_run_cond);
}

void mt_bench_run_conditions(const char *bench) {
    if (g_run_bench) return;
    g_run_bench = bench;
    mt_bench_cond_start(&g_run_cond);
    atexit(emit_run_conditions);
}

void *mt_bench_alloc_huge(size_t bytes) {
    size_t len = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    /* Straight from the kernel (not the allocator: its heap is the table's, and freed memory
     * it kept would be reused by the next table), one huge page more to align the start. */
    char *m =
        mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > m) munmap(m, (size_t)(p - m));
    if (p + len < m + len + HUGE_PAGE) munmap(p + len, (size_t)(m + len + HUGE_PAGE - (p + len)));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE);
#endif
    return p;
}

void mt_bench_free_huge(void *p, size_t bytes) {
    if (p) munmap(p, (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
}
