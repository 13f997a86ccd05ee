/*
 * tls_certs.h - throwaway certificates for the TLS tests, made with the openssl CLI at test
 * time in a fresh temporary directory (keys are never committed).
 *
 *   ca.pem / ca.key          the test CA
 *   server.pem / server.key  signed by ca: CN localhost, SAN DNS:localhost, IP:127.0.0.1
 *   named.pem / named.key    signed by ca: SAN DNS:ps.monolith.test only (server_name tests)
 *   client.pem / client.key  signed by ca: CN monolith-client, clientAuth
 *   other.pem / other.key    another CA, and other-server.pem / .key signed by it
 *   garbage.pem              not PEM
 *
 * EC P-256 keys: generating all of them takes a few tens of milliseconds.
 */
#ifndef MT_TEST_TLS_CERTS_H
#define MT_TEST_TLS_CERTS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes the files in a new directory. @p dir receives its path. @returns 0 or -1. */
static int tls_certs_make(char *dir, size_t len) {
    snprintf(dir, len, "/tmp/mt-tls-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "set -e; cd '%s'; exec 2>openssl.log; "
             "K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'; "
             "openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=mt-test-ca; "
             "openssl req -x509 $K -keyout other.key -out other.pem -days 2 -subj /CN=mt-other-ca; "
             "sign() { " /* name, CN, signing CA, extension lines... */
             "  n=$1; cn=$2; ca=$3; shift 3; "
             "  openssl req $K -keyout $n.key -out $n.csr -subj \"/CN=$cn\"; "
             "  printf '%%s\\n' 'basicConstraints=CA:FALSE' \"$@\" > $n.ext; "
             "  openssl x509 -req -in $n.csr -CA $ca.pem -CAkey $ca.key -CAcreateserial -days 2 "
             "    -extfile $n.ext -out $n.pem; "
             "}; "
             "sign server localhost ca 'subjectAltName=DNS:localhost,IP:127.0.0.1' "
             "  'extendedKeyUsage=serverAuth,clientAuth'; "
             "sign named ps.monolith.test ca 'subjectAltName=DNS:ps.monolith.test'; "
             "sign client monolith-client ca 'extendedKeyUsage=clientAuth'; "
             "sign other-server localhost other 'subjectAltName=DNS:localhost,IP:127.0.0.1'; "
             "echo 'not a certificate' > garbage.pem",
             dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* "<dir>/<name>" in a static buffer of 8 rotating slots (enough for one config). */
static const char *tls_path(const char *dir, const char *name) {
    static char bufs[8][256];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
    return b;
}

static void tls_certs_remove(const char *dir) {
    if (!dir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
}

#endif /* MT_TEST_TLS_CERTS_H */
