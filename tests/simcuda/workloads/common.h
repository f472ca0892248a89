/* Shared helpers for the simulated-CUDA workloads. */
#ifndef SIM_WORKLOAD_COMMON_H
#define SIM_WORKLOAD_COMMON_H
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ULL * 1024ULL)
#define GiB (1024ULL * MiB)

/* FNV-1a over 64-bit values: the checksum of what a workload computed. */
typedef struct {
    uint64_t h;
} cksum_t;
static inline void ck_init(cksum_t *c) { c->h = 0xcbf29ce484222325ULL; }
static inline void ck_add(cksum_t *c, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        c->h ^= (v >> (8 * i)) & 0xff;
        c->h *= 0x100000001b3ULL;
    }
}
static inline void ck_print(const cksum_t *c) { printf("checksum=%016llx\n", (unsigned long long)c->h); }

static inline const char *arg_val(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return NULL;
}
/* --name N as an int, or dflt when the flag is absent. */
static inline int arg_int(int argc, char **argv, const char *name, int dflt) {
    const char *v = arg_val(argc, argv, name);
    return v ? atoi(v) : dflt;
}
static inline int has_flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return 1;
    return 0;
}
static inline uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    return strtoull(s, NULL, 10);
}
#define DIE(...)                                                                                                       \
    do {                                                                                                               \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        exit(1);                                                                                                       \
    } while (0)

/* Installs `handler` for `sig` (no flags), or dies. */
static inline void handle_signal(int sig, void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    if (sigaction(sig, &sa, NULL)) DIE("sigaction");
}
#endif
