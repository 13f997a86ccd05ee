/* testutil_daemon.c - see testutil_daemon.h. */
#include "testutil_daemon.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

pid_t tu_procs_spawn(tu_procs_t *p, char *const argv[], const char *log, const char *log_mode) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(log, log_mode, stderr)) _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    if (p->n < TU_PROCS_MAX) p->pid[p->n++] = pid;
    return pid;
}

void tu_procs_forget(tu_procs_t *p, pid_t pid) {
    for (int i = 0; i < p->n; i++)
        if (p->pid[i] == pid) p->pid[i] = 0;
}

int tu_procs_stop(tu_procs_t *p, pid_t pid, int sig) {
    kill(pid, sig);
    int st = 0;
    waitpid(pid, &st, 0);
    tu_procs_forget(p, pid);
    return st;
}

void tu_procs_kill_all(tu_procs_t *p) {
    for (int i = 0; i < p->n; i++) {
        if (p->pid[i] > 0) {
            kill(p->pid[i], SIGKILL);
            waitpid(p->pid[i], NULL, 0);
        }
    }
    p->n = 0;
}

int tu_read_port_file(const char *path, int timeout_s) {
    for (int i = 0; i < timeout_s * 10; i++) {
        FILE *f = fopen(path, "r");
        int v = 0;
        if (f) {
            int ok = fscanf(f, "%d", &v) == 1;
            fclose(f);
            if (ok && v > 0) return v;
        }
        usleep(100000);
    }
    return -1;
}

int tu_metrics_port(const char *log) {
    for (int i = 0; i < 100; i++) {
        FILE *f = fopen(log, "r");
        char line[512];
        int port = -1;
        while (f && fgets(line, sizeof(line), f)) {
            char *m = strstr(line, "metrics on port ");
            if (m) port = atoi(m + 16);
        }
        if (f) fclose(f);
        if (port > 0) return port;
        usleep(100000);
    }
    return -1;
}

char *tu_http_get(int port, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return NULL;
    }
    char req[128];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return NULL;
    }
    ssize_t r;
    while ((r = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)r;
    buf[len] = 0;
    close(fd);
    return buf;
}

int tu_run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
