/*
 * testutil_data.h - the real public datasets of ../shared/data, for the tests that read them.
 *
 * A user's clone has no ../shared beside it, so a case that needs a dataset is skipped when
 * the file is absent: Criterion's cr_skip_test (counted and printed as skipped, never a pass
 * nor a failure), plus one line "<test>: <path> missing" appended to the file named by
 * $MT_SKIP_LOG when it is set, from which scripts/test.sh prints how many cases were skipped.
 *
 * The data folder is MT_SHARED_DATA of the build (${CMAKE_SOURCE_DIR}/../shared/data),
 * unless the environment variable MT_SHARED_DATA names another one (an empty folder shows
 * what a clone without data does).
 */
#ifndef MT_TESTUTIL_DATA_H
#define MT_TESTUTIL_DATA_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef MT_SHARED_DATA
#define MT_SHARED_DATA "../shared/data"
#endif

/** The datasets' folder (borrowed: the environment's or the build's string). */
static inline const char *mt_test_data_dir(void) {
    const char *e = getenv("MT_SHARED_DATA");
    return e && *e ? e : MT_SHARED_DATA;
}

/** Writes "<dir>/<rel>" into path. */
static inline void mt_test_data_path(char *path, size_t cap, const char *rel) {
    snprintf(path, cap, "%s/%s", mt_test_data_dir(), rel);
}

/** Records the skip in $MT_SKIP_LOG (one line, appended atomically). */
static inline void mt_test_record_skip(const char *what) {
    const char *log = getenv("MT_SKIP_LOG");
    if (!log || !*log) return;
    char line[1024];
    int n = snprintf(line, sizeof(line), "%s::%s: %s missing\n", criterion_current_test->category,
                     criterion_current_test->name, what);
    if (n <= 0) return;
    if ((size_t)n >= sizeof(line)) n = (int)sizeof(line) - 1;
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}

/** Skips the running case unless @p path can be read (a file or a folder). */
static inline void mt_test_need_data(const char *path) {
    if (access(path, R_OK) == 0) return;
    mt_test_record_skip(path);
    cr_skip_test("%s missing (a clone without ../shared/data): real-data case skipped", path);
}

#endif /* MT_TESTUTIL_DATA_H */
