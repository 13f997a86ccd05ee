/*
 * testutil_files.h - the files the replay tests write for themselves (test_replay.c,
 * test_replay_csv.c): a temporary directory per test and logs in it, plain or gzipped.
 *
 * Header-only (static inline), like tests/unit/ps/testutil_ps.h; the includer links zlib.
 * The helpers assert with Criterion: call them from the test's thread.
 */
#ifndef MT_TESTUTIL_FILES_H
#define MT_TESTUTIL_FILES_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

/* Creates a new directory /tmp/<prefix>-XXXXXX into @p dir (64 bytes). */
static inline void tu_tmpdir_make(char *dir, const char *prefix) {
    snprintf(dir, 64, "/tmp/%s-XXXXXX", prefix);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s", dir);
}

static inline int tu__rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Removes @p dir and everything in it (an empty name: nothing). */
static inline void tu_tmpdir_remove(char *dir) {
    if (!*dir) return;
    nftw(dir, tu__rm_one, 16, FTW_DEPTH | FTW_PHYS);
    *dir = '\0';
}

/* Writes @p len bytes of @p text to @p path, gzipped if @p gz. */
static inline void tu_write_file(const char *path, const char *text, size_t len, bool gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        cr_assert_not_null(f, "gzopen %s", path);
        cr_assert_eq(gzwrite(f, text, (unsigned)len), (int)len);
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f, "fopen %s", path);
        cr_assert_eq(fwrite(text, 1, len, f), len);
        cr_assert_eq(fclose(f), 0);
    }
}

#endif /* MT_TESTUTIL_FILES_H */
