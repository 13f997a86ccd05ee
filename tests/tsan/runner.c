/*
 * runner.c (ThreadSanitizer build only) - runs the cases registered through the Criterion
 * subset of tests/tsan/criterion/criterion.h, each in a forked child, at most --jobs at a
 * time, and prints one line per case and a synthesis like Criterion's:
 *
 *   [PASS] suite::name (0.12 s)
 *   [FAIL] suite::name: exit status 66 (a ThreadSanitizer report: see above)
 *   [SKIP] suite::name: <why>
 *   [====] Synthesis: Tested: 5 | Passing: 4 | Failing: 1 | Crashing: 0 | Skipped: 0
 *
 * A child's status: 0 passed; 77 skipped; 1 an assertion or expectation failed; 66
 * ThreadSanitizer reported (TSan's exitcode); a signal crashed (SIGALRM: its timeout, scaled
 * by $MT_TSAN_TIMEOUT_SCALE, default 4, for TSan's slowdown). The exit status is 0 only when
 * no case failed or crashed.
 *
 * Options: --filter PATTERN (fnmatch on suite/name), --jobs N / -jN, --verbose, -l / --list;
 * Criterion's other options are accepted and ignored.
 */
#include <fnmatch.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "criterion/criterion.h"

#define SKIP_STATUS 77

const struct criterion_test *criterion_current_test;

static const struct criterion_test **tests;
static size_t ntests, tests_cap;
static const struct criterion_suite **suites;
static size_t nsuites, suites_cap;
static int expect_failed; /* in a child: a cr_expect failed */

static void *grow(void *p, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return p;
    *cap = *cap ? *cap * 2 : 64;
    void *q = realloc(p, *cap * size);
    if (!q) {
        fprintf(stderr, "tsan runner: out of memory\n");
        exit(2);
    }
    return q;
}

void mt_shim_register_test(const struct criterion_test *t) {
    tests = grow(tests, &tests_cap, ntests, sizeof(*tests));
    tests[ntests++] = t;
}

void mt_shim_register_suite(const struct criterion_suite *s) {
    suites = grow(suites, &suites_cap, nsuites, sizeof(*suites));
    suites[nsuites++] = s;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static void vprint(FILE *f, const char *prefix, const char *fmt, va_list ap) {
    fputs(prefix, f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
}
#pragma GCC diagnostic pop

void mt_shim_check(bool ok, bool fatal, const char *file, int line, const char *what,
                   const char *fmt, ...) {
    if (ok) return;
    fprintf(stderr, "[----] %s:%d: %s::%s: %s", file, line,
            criterion_current_test ? criterion_current_test->category : "?",
            criterion_current_test ? criterion_current_test->name : "?", what);
    va_list ap;
    va_start(ap, fmt);
    vprint(stderr, "", fmt, ap);
    va_end(ap);
    if (fatal) exit(1);
    expect_failed = 1;
}

void criterion_skip_test(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint(stderr, "[SKIP] ", fmt, ap);
    va_end(ap);
    exit(SKIP_STATUS);
}

void mt_shim_log(const char *level, const char *fmt, ...) {
    char prefix[16];
    snprintf(prefix, sizeof(prefix), "[%s] ", level);
    va_list ap;
    va_start(ap, fmt);
    vprint(stderr, prefix, fmt, ap);
    va_end(ap);
}

static const struct criterion_suite *suite_of(const struct criterion_test *t) {
    for (size_t i = 0; i < nsuites; i++)
        if (!strcmp(suites[i]->name, t->category)) return suites[i];
    return NULL;
}

static double timeout_of(const struct criterion_test *t) {
    const struct criterion_suite *s = suite_of(t);
    double to = t->data->timeout > 0 ? t->data->timeout : s ? s->data->timeout : 0;
    const char *e = getenv("MT_TSAN_TIMEOUT_SCALE");
    double scale = e && atof(e) > 0 ? atof(e) : 4.0;
    return to * scale;
}

/* In the child: the case between its suite's and its own init and fini. */
static void run_child(const struct criterion_test *t) {
    const struct criterion_suite *s = suite_of(t);
    criterion_current_test = t;
    double to = timeout_of(t);
    if (to > 0) alarm((unsigned)(to + 0.999));
    if (s && s->data->init) s->data->init();
    if (t->data->init) t->data->init();
    t->test();
    if (t->data->fini) t->data->fini();
    if (s && s->data->fini) s->data->fini();
    exit(expect_failed ? 1 : 0);
}

static int by_name(const void *a, const void *b) {
    const struct criterion_test *x = *(const struct criterion_test *const *)a;
    const struct criterion_test *y = *(const struct criterion_test *const *)b;
    int c = strcmp(x->category, y->category);
    return c ? c : strcmp(x->name, y->name);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct running {
    pid_t pid;
    const struct criterion_test *t;
    double t0;
} running_t;

int main(int argc, char **argv) {
    const char *filter = NULL;
    int jobs = 1, list = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--filter") && i + 1 < argc)
            filter = argv[++i];
        else if (!strncmp(a, "--filter=", 9))
            filter = a + 9;
        else if ((!strcmp(a, "--jobs") || !strcmp(a, "-j")) && i + 1 < argc)
            jobs = atoi(argv[++i]);
        else if (!strncmp(a, "-j", 2) && a[2])
            jobs = atoi(a + 2);
        else if (!strcmp(a, "-l") || !strcmp(a, "--list"))
            list = 1;
    }
    if (jobs < 1) jobs = 1;
    qsort(tests, ntests, sizeof(*tests), by_name);
    running_t *run = calloc((size_t)jobs, sizeof(*run));
    if (!run) return 2;
    int tested = 0, passing = 0, failing = 0, crashing = 0, skipped = 0, nrun = 0;
    size_t next = 0;
    fflush(stdout);
    fflush(stderr);
    for (;;) {
        while (nrun < jobs && next < ntests) {
            const struct criterion_test *t = tests[next++];
            char full[512];
            snprintf(full, sizeof(full), "%s/%s", t->category, t->name);
            if (filter && fnmatch(filter, full, 0) != 0) continue;
            if (list) {
                printf("%s::%s\n", t->category, t->name);
                continue;
            }
            if (t->data->disabled) {
                fprintf(stderr, "[SKIP] %s::%s: disabled\n", t->category, t->name);
                skipped++;
                continue;
            }
            pid_t pid = fork();
            if (pid < 0) {
                perror("tsan runner: fork");
                return 2;
            }
            if (pid == 0) run_child(t);
            for (int k = 0; k < jobs; k++)
                if (!run[k].pid) {
                    run[k] = (running_t){pid, t, now_s()};
                    break;
                }
            nrun++;
        }
        if (nrun == 0) break;
        int st;
        pid_t pid = wait(&st);
        if (pid < 0) break;
        for (int k = 0; k < jobs; k++) {
            if (run[k].pid != pid) continue;
            const struct criterion_test *t = run[k].t;
            double dt = now_s() - run[k].t0;
            run[k].pid = 0;
            nrun--;
            if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP_STATUS) {
                skipped++;
                break;
            }
            tested++;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                passing++;
                fprintf(stderr, "[PASS] %s::%s (%.2f s)\n", t->category, t->name, dt);
            } else if (WIFEXITED(st)) {
                failing++;
                fprintf(stderr, "[FAIL] %s::%s: exit status %d%s (%.2f s)\n", t->category, t->name,
                        WEXITSTATUS(st), WEXITSTATUS(st) == 66 ? " (a ThreadSanitizer report)" : "",
                        dt);
            } else {
                crashing++;
                fprintf(stderr, "[FAIL] %s::%s: killed by signal %d%s (%.2f s)\n", t->category,
                        t->name, WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (timeout)" : "", dt);
            }
            break;
        }
    }
    free(run);
    free(tests);
    free(suites);
    if (list) return 0;
    fprintf(stderr,
            "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d | "
            "Skipped: %d\n",
            tested, passing, failing, crashing, skipped);
    return failing || crashing ? 1 : 0;
}
