/*
 * fuzz_rpc_stub.h - drives RPC handlers without gRPC. The PS and serving fuzzers are linked
 * with -Wl,--wrap=<symbol> for the mt_rpc_* functions their libraries call, so that:
 *   mt_rpc_server_add()  records the handler (path, fn, ud) instead of registering it;
 *   mt_rpc_reply/send()  read the reply bytes (ASan checks them) and drop them;
 *   mt_rpc_fail()        formats the message (checks the format arguments) and drops it.
 * mt_fuzz_rpc_call() then calls a recorded handler on the raw request bytes, as the server
 * would after receiving them.
 *
 * Targets linked with WRAP_RPC_CLIENT also get the client side: mt_rpc_call(),
 * mt_rpc_call_many() and mt_rpc_stream_open/next/close() are answered in process by the
 * handlers recorded for their path (whatever the channel: one in-process server), their
 * replies and stream messages collected instead of dropped. That lets a serving replica
 * sync from an in-process mt_ps_t through the real psclient and sync code. Client calls may
 * come from several threads (they are serialized by a lock); mt_fuzz_rpc_call() must not run
 * while a client call does. A stream's handler runs to its end inside
 * mt_rpc_stream_open(), under that lock, with 60 s left and sends that never fail: a
 * following Sync (follow_ms > 0 with followers allowed) would hold the lock for the PS's
 * sync_follow_max_s, so in-process PSs set sync_max_followers = 0.
 */
#ifndef MT_FUZZ_RPC_STUB_H
#define MT_FUZZ_RPC_STUB_H

#include <stddef.h>
#include <stdint.h>

#include "mt/rpc.h"

/* The wrappers (called instead of the real functions by the wrapped libraries). */
mt_err_t __wrap_mt_rpc_server_add(mt_rpc_server_t *s, const char *path, int streaming,
                                  mt_rpc_handler_fn fn, void *ud);
void __wrap_mt_rpc_server_set_serving(mt_rpc_server_t *s, int serving);
void __wrap_mt_rpc_reply(mt_rpc_call_t *c, const uint8_t *buf, size_t len);
void __wrap_mt_rpc_fail(mt_rpc_call_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
mt_err_t __wrap_mt_rpc_send(mt_rpc_call_t *c, const uint8_t *buf, size_t len);
const char *__wrap_mt_rpc_call_metadata(const mt_rpc_call_t *c, const char *key);
int64_t __wrap_mt_rpc_call_remaining_ms(const mt_rpc_call_t *c);

/* The client side (WRAP_RPC_CLIENT). */
mt_err_t __wrap_mt_rpc_call(mt_rpc_channel_t *ch, const char *path, const uint8_t *req, size_t len,
                            int64_t deadline_ms, uint8_t **resp, size_t *resp_len,
                            mt_rpc_status_t *st);
mt_err_t __wrap_mt_rpc_call_many(mt_rpc_batch_call_t *calls, size_t n, int64_t deadline_ms);
mt_err_t __wrap_mt_rpc_stream_open(mt_rpc_channel_t *ch, const char *path, const uint8_t *req,
                                   size_t len, int64_t deadline_ms, mt_rpc_stream_t **out);
mt_err_t __wrap_mt_rpc_stream_next(mt_rpc_stream_t *s, uint8_t **buf, size_t *len);
void __wrap_mt_rpc_stream_close(mt_rpc_stream_t *s, mt_rpc_status_t *st);

/* Calls the handler recorded for @p path (e.g. "/monolith.v1.ParameterServer/Lookup") on
 * @p req. @returns 0, or -1 when no handler has that path. */
int mt_fuzz_rpc_call(const char *path, const uint8_t *req, size_t len);

/* Forgets the recorded handlers (before registering a new service). */
void mt_fuzz_rpc_reset(void);

/* The status of the last call: 0 after a reply, the gRPC code after a failure. */
int mt_fuzz_rpc_last_code(void);

#endif /* MT_FUZZ_RPC_STUB_H */
