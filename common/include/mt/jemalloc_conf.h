/*
 * jemalloc_conf.h - include once, in a program's main.c: jemalloc options baked into the
 * binary (the MALLOC_CONF environment variable still overrides them).
 *
 * thp:always   back jemalloc's memory with transparent huge pages (the kernel's THP mode is
 *              "madvise" on Debian): the table's rows and buckets are read at random, and
 *              with 4 KiB pages nearly every read also misses the TLB. Measured on the table
 *              benchmark: about 1.5-2x the lookup rate at 5-10M rows.
 * metadata_thp:auto  the same for jemalloc's own metadata once it is large.
 */
#ifndef MT_JEMALLOC_CONF_H
#define MT_JEMALLOC_CONF_H

#ifdef MT_HAVE_JEMALLOC
/* Default visibility: we build with -fvisibility=hidden, and a hidden definition would not
 * interpose jemalloc's own (weak) malloc_conf, silently leaving these options off. */
extern const char *malloc_conf;
__attribute__((visibility("default"))) const char *malloc_conf = "thp:always,metadata_thp:auto";
#endif

#endif /* MT_JEMALLOC_CONF_H */
