/*
 * http.h - a minimal HTTP/1.0 server for operational endpoints (Prometheus /metrics,
 * /healthz): one GET per connection, bodies from a callback. Not for user traffic.
 *
 * One thread serves every connection at once (a poll(2) loop over non-blocking sockets), so
 * an idle or slow peer never delays another's request. Bounds: at most MT_HTTP_MAX_CONNS
 * connections (one more closes the oldest), a request line and headers of at most 2 KiB,
 * and MT_HTTP_REQUEST_TIMEOUT_MS for the whole request from the connection's accept (a
 * peer still sending then gets 408 and is closed), as long again to send the answer.
 *
 * Thread safety: the render callback runs on the server's one thread, one request at a time
 * (never concurrently with itself); it must be thread-safe with respect to the rest of the
 * program, and should be quick: every connection waits while it runs. mt_http_stop() may be
 * called from any thread.
 */
#ifndef MT_HTTP_H
#define MT_HTTP_H

#include <stddef.h>

#include "mt/err.h"

#define MT_HTTP_MAX_CONNS          64   /* open connections; one more closes the oldest */
#define MT_HTTP_REQUEST_TIMEOUT_MS 5000 /* whole request from accept; the answer as long */

typedef struct mt_http mt_http_t;

/** Writes the body for @p path into a malloc'd buffer (*body, *len; the server frees it).
 *  @returns the HTTP status (200, or 404 for paths it does not serve). */
typedef int (*mt_http_render_fn)(void *ud, const char *path, char **body, size_t *len);

/**
 * Starts listening on @p listen ("127.0.0.1:0" picks a port).
 * @param[out] port  the bound port. @param[out] out  stop and free with mt_http_stop().
 * @returns MT_OK, MT_CONFIG (bad address), MT_IO (bind/listen failed).
 */
mt_err_t mt_http_start(const char *listen, mt_http_render_fn fn, void *ud, int *port,
                       mt_http_t **out);

/** Stops the server and frees it. NULL is a no-op. */
void mt_http_stop(mt_http_t *h);

#endif /* MT_HTTP_H */
