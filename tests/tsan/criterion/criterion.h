/*
 * criterion.h (ThreadSanitizer build only) - the part of Criterion's API our tests use, over
 * a small runner of our own (tests/tsan/runner.c), so that the same test files run under
 * ThreadSanitizer. Criterion itself cannot: its boxfort arena fails to map under TSan
 * ("Could not initialize inheritable arena", Snaipe/Criterion#274, open since 2018).
 *
 * What it keeps of Criterion: Test(suite, name, .init, .fini, .timeout, .disabled),
 * TestSuite(suite, ...) whose init/fini run around each test of the suite (suite init, test
 * init, test, test fini, suite fini), each case in a forked child with its timeout, the
 * cr_assert / cr_expect families with optional printf-style messages, cr_log_*,
 * cr_skip_test, criterion_current_test, --filter suite/name (fnmatch) and --jobs N. A failed
 * cr_assert ends the case; a failed cr_expect marks it failed and goes on.
 */
#ifndef MT_TSAN_CRITERION_H
#define MT_TSAN_CRITERION_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct criterion_test_extra_data {
    int sentinel_;
    void (*init)(void);
    void (*fini)(void);
    double timeout;
    bool disabled;
    const char *description;
    int exit_code;
    int signal;
};

struct criterion_test {
    const char *name;
    const char *category;
    void (*test)(void);
    const struct criterion_test_extra_data *data;
};

struct criterion_suite {
    const char *name;
    const struct criterion_test_extra_data *data;
};

/* The case running in this process (a child of the runner), NULL in the runner. */
extern const struct criterion_test *criterion_current_test;

void mt_shim_register_test(const struct criterion_test *t);
void mt_shim_register_suite(const struct criterion_suite *s);
/* No format attributes: the messages are optional, so fmt may be "" (as in Criterion). */
void mt_shim_check(bool ok, bool fatal, const char *file, int line, const char *what,
                   const char *fmt, ...);
__attribute__((noreturn)) void criterion_skip_test(const char *fmt, ...);
void mt_shim_log(const char *level, const char *fmt, ...);

#define Test(suite, name, ...)                                                              \
    static void suite##_##name##_impl(void);                                                \
    static const struct criterion_test_extra_data suite##_##name##_data = {0, __VA_ARGS__}; \
    static const struct criterion_test suite##_##name##_test = {                            \
        #name, #suite, suite##_##name##_impl, &suite##_##name##_data};                      \
    __attribute__((constructor)) static void suite##_##name##_register(void) {              \
        mt_shim_register_test(&suite##_##name##_test);                                      \
    }                                                                                       \
    static void suite##_##name##_impl(void)

#define TestSuite(suite, ...)                                                            \
    static const struct criterion_test_extra_data suite##_suite_data = {0, __VA_ARGS__}; \
    static const struct criterion_suite suite##_suite = {#suite, &suite##_suite_data};   \
    __attribute__((constructor)) static void suite##_suite_register(void) {              \
        mt_shim_register_suite(&suite##_suite);                                          \
    }                                                                                    \
    struct mt_shim_swallow_semicolon_##suite

/* ---- assertions: cr_assert_X ends the case, cr_expect_X marks it failed ---- */
#define MT_SHIM_CHECK(fatal, cond, what, ...) \
    mt_shim_check((cond) ? true : false, fatal, __FILE__, __LINE__, what, "" __VA_ARGS__)

#define cr_assert(cond, ...) MT_SHIM_CHECK(true, cond, "assertion failed: " #cond ": ", __VA_ARGS__)
#define cr_expect(cond, ...) \
    MT_SHIM_CHECK(false, cond, "expectation failed: " #cond ": ", __VA_ARGS__)
#define cr_assert_fail(...) MT_SHIM_CHECK(true, 0, "cr_assert_fail: ", __VA_ARGS__)

#define MT_SHIM_CMP(fatal, a, op, b, ...) \
    MT_SHIM_CHECK(fatal, (a)op(b), #a " " #op " " #b ": ", __VA_ARGS__)
#define cr_assert_eq(a, b, ...)  MT_SHIM_CMP(true, a, ==, b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) MT_SHIM_CMP(true, a, !=, b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...)  MT_SHIM_CMP(true, a, <, b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) MT_SHIM_CMP(true, a, <=, b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...)  MT_SHIM_CMP(true, a, >, b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) MT_SHIM_CMP(true, a, >=, b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...)  MT_SHIM_CMP(false, a, ==, b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) MT_SHIM_CMP(false, a, !=, b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...)  MT_SHIM_CMP(false, a, <, b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) MT_SHIM_CMP(false, a, <=, b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...)  MT_SHIM_CMP(false, a, >, b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) MT_SHIM_CMP(false, a, >=, b, __VA_ARGS__)

#define cr_assert_null(p, ...)     MT_SHIM_CHECK(true, (p) == NULL, #p " is NULL: ", __VA_ARGS__)
#define cr_assert_not_null(p, ...) MT_SHIM_CHECK(true, (p) != NULL, #p " != NULL: ", __VA_ARGS__)
#define cr_expect_null(p, ...)     MT_SHIM_CHECK(false, (p) == NULL, #p " is NULL: ", __VA_ARGS__)
#define cr_expect_not_null(p, ...) MT_SHIM_CHECK(false, (p) != NULL, #p " != NULL: ", __VA_ARGS__)

#define cr_assert_str_eq(a, b, ...) \
    MT_SHIM_CHECK(true, strcmp((a), (b)) == 0, #a " equals " #b ": ", __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) \
    MT_SHIM_CHECK(false, strcmp((a), (b)) == 0, #a " equals " #b ": ", __VA_ARGS__)
#define cr_assert_arr_eq(a, b, n, ...) \
    MT_SHIM_CHECK(true, memcmp((a), (b), (n)) == 0, #a " bytes equal " #b ": ", __VA_ARGS__)
#define cr_expect_arr_eq(a, b, n, ...) \
    MT_SHIM_CHECK(false, memcmp((a), (b), (n)) == 0, #a " bytes equal " #b ": ", __VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...)                                \
    MT_SHIM_CHECK(true, fabs((double)(a) - (double)(b)) <= (double)(eps), \
                  #a " == " #b " within " #eps ": ", __VA_ARGS__)
#define cr_expect_float_eq(a, b, eps, ...)                                 \
    MT_SHIM_CHECK(false, fabs((double)(a) - (double)(b)) <= (double)(eps), \
                  #a " == " #b " within " #eps ": ", __VA_ARGS__)

#define cr_skip_test(...) criterion_skip_test("" __VA_ARGS__)

#define cr_log_info(...)  mt_shim_log("INFO", "" __VA_ARGS__)
#define cr_log_warn(...)  mt_shim_log("WARN", "" __VA_ARGS__)
#define cr_log_error(...) mt_shim_log("ERR ", "" __VA_ARGS__)

#endif /* MT_TSAN_CRITERION_H */
