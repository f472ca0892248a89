/* ollama_shape: ollama's process shape (issue #12), one binary in two roles as ollama is.
 *   ollama_shape            the server ("ollama serve", a Go program): never touches CUDA,
 *                           links no CUDA library; starts every child below and prints the
 *                           checksum of their exit statuses.
 *   ollama_shape runner --discover
 *                           a GPU-discovery child: dlopens the backend, counts devices, exits.
 *   ollama_shape runner --model NAME --gpu-mib N
 *                           a model runner: dlopens the backend (RTLD_LOCAL, as ggml's loader
 *                           does), loads N MiB of weights on the GPU plus KV, compute, cuBLAS
 *                           and the VMM pool, says "ready" and waits to be killed (ollama
 *                           unloads a model with SIGKILL); an OOM ends it with exit 2.
 * The server: discovery; runner "a" (512 MiB); runner "b" asking 20 GiB (more than the
 * simulated 16 GiB: OOM, exit 2); runner "b" again with 4 GiB on the GPU (ollama's restart
 * with fewer layers); then both loaded runners unloaded (SIGKILL). Exit 0. */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static char self[PATH_MAX];

static void *backend(void) {
    char dir[PATH_MAX], path[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s", self);
    snprintf(path, sizeof path, "%s/../libollama_backend.so", dirname(dir));
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) DIE("dlopen %s: %s", path, dlerror());
    return h;
}

static int runner(int argc, char **argv) {
    void *h = backend();
    if (has_flag(argc, argv, "--discover")) {
        int (*devices)(void) = (int (*)(void))dlsym(h, "backend_devices");
        return devices && devices() > 0 ? 0 : 1;
    }
    int (*load)(uint64_t, uint64_t *) = (int (*)(uint64_t, uint64_t *))dlsym(h, "backend_load");
    const char *gpu = arg_val(argc, argv, "--gpu-mib");
    if (!load || !gpu) DIE("runner: no backend_load or --gpu-mib");
    uint64_t ck = 0;
    int r = load(strtoull(gpu, NULL, 10), &ck);
    if (r) return r;
    printf("ready %016llx\n", (unsigned long long)ck);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

/* Starts `self runner ARGS...` with pipes on its stdin and stdout; returns its pid. */
static pid_t spawn(char *const args[], int *out_fd, int *in_fd) {
    int out[2], in[2];
    if (pipe(out) || pipe(in)) DIE("pipe");
    pid_t pid = fork();
    if (pid < 0) DIE("fork");
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        execv(self, args);
        _exit(127);
    }
    close(in[0]), close(out[1]);
    *out_fd = out[0], *in_fd = in[1];
    return pid;
}

/* 1 when the runner said "ready", 0 when it ended first. */
static int ready(int fd) {
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    return n > 5 && strncmp(buf, "ready", 5) == 0;
}

static int wait_status(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) DIE("waitpid");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) DIE("readlink /proc/self/exe");
    self[n] = 0;
    if (argc > 1 && strcmp(argv[1], "runner") == 0) return runner(argc, argv);

    cksum_t ck;
    ck_init(&ck);
    int o, i;
    char *disc[] = {self, "runner", "--discover", NULL};
    pid_t d = spawn(disc, &o, &i);
    close(i);
    ck_add(&ck, (uint64_t)wait_status(d));
    close(o);

    char *a_args[] = {self, "runner", "--model", "a", "--gpu-mib", "512", NULL};
    int a_out, a_in;
    pid_t a = spawn(a_args, &a_out, &a_in);
    ck_add(&ck, (uint64_t)ready(a_out));

    char *b_args[] = {self, "runner", "--model", "b", "--gpu-mib", "20480", NULL};
    int b_out, b_in;
    pid_t b = spawn(b_args, &b_out, &b_in);
    ck_add(&ck, (uint64_t)ready(b_out)); /* 0: it ran out of memory */
    ck_add(&ck, (uint64_t)wait_status(b));
    close(b_out), close(b_in);

    char *b2_args[] = {self, "runner", "--model", "b", "--gpu-mib", "4096", NULL};
    int b2_out, b2_in;
    pid_t b2 = spawn(b2_args, &b2_out, &b2_in);
    ck_add(&ck, (uint64_t)ready(b2_out));

    kill(a, SIGKILL);
    kill(b2, SIGKILL);
    ck_add(&ck, (uint64_t)wait_status(a));
    ck_add(&ck, (uint64_t)wait_status(b2));
    printf("pids serve %d discover %d a %d b %d b2 %d\n", (int)getpid(), (int)d, (int)a, (int)b, (int)b2);
    ck_print(&ck);
    return 0;
}
