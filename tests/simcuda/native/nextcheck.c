/* A library that wraps puts() the usual way: dlsym(RTLD_NEXT, "puts").
 * glibc resolves RTLD_NEXT relative to the caller. If an interposed dlsym forwarded the
 * lookup with an ordinary call, "next" would be computed from the interposer instead,
 * land on this very function, and recurse: we exit 42 when that happens. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

static int depth;

int puts(const char *s) {
    static int (*next)(const char *);
    if (!next) next = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
    if (!next) _exit(43);
    if (++depth > 1) _exit(42);
    int r = next(s);
    depth--;
    return r;
}
