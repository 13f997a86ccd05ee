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
#include <sys/prctl.h>
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
