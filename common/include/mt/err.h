/*
 * err.h - the one error type of Monolith-C.
 *
 * Every fallible function returns mt_err_t: MT_OK (0) on success, a negative code otherwise.
 * The codes come from one X-macro list that also gives each its name, its message and the
 * gRPC status code a daemon answers with (numeric values of grpc_status_code, so that this
 * header does not depend on gRPC).
 *
 * Thread safety: every function here is pure and thread-safe.
 */
#ifndef MT_ERR_H
#define MT_ERR_H

#include <stddef.h>

/* X(name, value, grpc_status, message) */
#define MT_ERR_MAP(X)                                                                \
    X(OK, 0, 0, "success")                                                           \
    X(NOMEM, -1, 8, "out of memory")                                                 \
    X(INVALID, -2, 3, "invalid argument")                                            \
    X(UNKNOWN_SLOT, -3, 3, "feature id belongs to a slot that is not configured")    \
    X(TOO_SMALL, -4, 3, "output buffer too small")                                   \
    X(FULL_SYNC, -5, 9, "version too old for an incremental sync: full sync needed") \
    X(IO, -6, 14, "input/output error")                                              \
    X(TRUNCATED, -7, 3, "input ended early (truncated)")                             \
    X(CORRUPT, -8, 3, "input is corrupt (bad magic, checksum or field)")             \
    X(VERSION, -9, 3, "unsupported format version")                                  \
    X(LIMIT, -10, 8, "a configured limit was reached")                               \
    X(NOT_FOUND, -11, 5, "not found")                                                \
    X(EXISTS, -12, 6, "already exists")                                              \
    X(MISMATCH, -13, 9, "input does not match the configuration")                    \
    X(UNAVAILABLE, -14, 14, "temporarily unavailable")                               \
    X(INTERNAL, -15, 13, "internal error")                                           \
    X(CANCELLED, -16, 1, "cancelled")                                                \
    X(TIMEOUT, -17, 4, "deadline exceeded")                                          \
    X(CONFIG, -18, 3, "bad configuration")                                           \
    X(FENCED, -19, 10, "fenced: another coordinator took over")                      \
    X(OUT_OF_ORDER, -20, 9, "out of order: the shard's marks moved (docs/checkpoint.md)")

typedef enum mt_err {
#define MT__ERR_ENUM(name, value, grpc, msg) MT_##name = (value),
    MT_ERR_MAP(MT__ERR_ENUM)
#undef MT__ERR_ENUM
} mt_err_t;

/** @returns a static, human-readable message for @p err ("unknown error" if not a code). */
const char *mt_strerror(mt_err_t err);

/** @returns the static symbolic name of @p err without the MT_ prefix, e.g. "NOMEM". */
const char *mt_err_name(mt_err_t err);

/** @returns the numeric gRPC status code a daemon answers @p err with (13 INTERNAL if unknown). */
int mt_err_grpc_status(mt_err_t err);

/**
 * Formats a message into a caller's error buffer (the errbuf / errlen pairs of the API).
 * NULL @p buf or 0 @p len: nothing. Thread-safe (writes @p buf only).
 */
void mt_msgf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* MT_ERR_H */
