/*
 * testutil_tsan.h - MT_NOT_UNDER_TSAN: a Test() option that leaves a case out of the
 * ThreadSanitizer build only (it still runs in the release and ASan builds). For cases that
 * cannot run under TSan, each saying why where it is used:
 *   Test(suite, name, MT_NOT_UNDER_TSAN) { ... }
 */
#ifndef MT_TESTUTIL_TSAN_H
#define MT_TESTUTIL_TSAN_H

#ifdef MT_TSAN
#define MT_NOT_UNDER_TSAN .disabled = 1
#else
#define MT_NOT_UNDER_TSAN .disabled = 0
#endif

#endif /* MT_TESTUTIL_TSAN_H */
