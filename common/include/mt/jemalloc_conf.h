/*
 * jemalloc_conf.h - include once, in a program's main.c: jemalloc options baked into the
 * binary (the MALLOC_CONF environment variable still overrides them).
 *
 * Transparent huge pages are asked for by the table itself, on its row arenas and bucket
 * blocks only (madvise in embedding/src/table.c and bpool.c; the kernel's THP mode is
 * "madvise" on Debian): they are read at random, and with 4 KiB pages nearly every read also misses the
 * TLB (about 1.5-2x the lookup rate at 5-10M rows). jemalloc's thp:always, used before,
 * backed the whole heap with huge pages: the kernel refilled freed small allocations as
 * huge pages, adding 30-45 MiB per daemon and an RSS creep in the soak (docs/soak.md).
 * metadata_thp:auto  huge pages for jemalloc's own metadata once it is large.
 */
#ifndef MT_JEMALLOC_CONF_H
#define MT_JEMALLOC_CONF_H

#ifdef MT_HAVE_JEMALLOC
/* Default visibility: we build with -fvisibility=hidden, and a hidden definition would not
 * interpose jemalloc's own (weak) malloc_conf, silently leaving these options off. */
extern const char *malloc_conf;
__attribute__((visibility("default"))) const char *malloc_conf = "metadata_thp:auto";
#endif

#endif /* MT_JEMALLOC_CONF_H */
