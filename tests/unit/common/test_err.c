#include <criterion/criterion.h>
#include <string.h>

#include "mt/err.h"

Test(err, names_messages_and_grpc_codes) {
    cr_assert_str_eq(mt_err_name(MT_OK), "OK");
    cr_assert_str_eq(mt_err_name(MT_NOMEM), "NOMEM");
    cr_assert_str_eq(mt_strerror(MT_FULL_SYNC),
                     "version too old for an incremental sync: full sync needed");
    cr_assert_eq(mt_err_grpc_status(MT_OK), 0);
    cr_assert_eq(mt_err_grpc_status(MT_INVALID), 3);      /* INVALID_ARGUMENT */
    cr_assert_eq(mt_err_grpc_status(MT_LIMIT), 8);        /* RESOURCE_EXHAUSTED */
    cr_assert_eq(mt_err_grpc_status(MT_UNAVAILABLE), 14); /* UNAVAILABLE */
    cr_assert_eq(mt_err_grpc_status(MT_FENCED), 10);      /* ABORTED */
    cr_assert_str_eq(mt_err_name(MT_FENCED), "FENCED");
    cr_assert_eq(mt_err_grpc_status(MT_OUT_OF_ORDER), 9); /* FAILED_PRECONDITION */
    cr_assert_str_eq(mt_strerror((mt_err_t)-999), "unknown error");
    cr_assert_eq(mt_err_grpc_status((mt_err_t)-999), 13);
}

Test(err, msgf_formats_into_the_callers_buffer) {
    char buf[8];
    mt_msgf(buf, sizeof(buf), "%s %d", "abc", 12345); /* truncated, terminated */
    cr_assert_str_eq(buf, "abc 123");
    mt_msgf(NULL, 10, "%d", 1); /* no buffer: nothing */
    buf[0] = 'x';
    mt_msgf(buf, 0, "%d", 1);
    cr_assert_eq(buf[0], 'x');
}
