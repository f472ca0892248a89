/* fork_exec: the parent allocates 4, 8 and 16 MiB (left live); it forks; the child
 * (which holds no device memory after fork and re-initialises the runtime)
 * allocates and frees three buffers, then execs `leak --n 4` (path: argv[1], else
 * `leak` beside this program), which exits 0 leaving its odd buffers live.
 * The parent waits and exits 0 only if the child did.
 * Leaves live at exit: parent 28 MiB; the child's pid (after exec: leak) as leak does. */
#include <libgen.h>
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "sim_cuda_runtime.h"

int main(int argc, char **argv) {
    cksum_t ck;
    ck_init(&ck);
    char leak_path[PATH_MAX];
    if (argc > 1) {
        snprintf(leak_path, sizeof leak_path, "%s", argv[1]);
    } else {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n < 0) DIE("readlink /proc/self/exe");
        self[n] = 0;
        snprintf(leak_path, sizeof leak_path, "%s/leak", dirname(self));
    }
    void *p[3];
    size_t sizes[3] = {4 * MiB, 8 * MiB, 16 * MiB};
    for (int i = 0; i < 3; i++) {
        cudaError_t e = cudaMalloc(&p[i], sizes[i]);
        if (e) DIE("parent cudaMalloc: %s", cudaGetErrorString(e));
        ck_add(&ck, (uint64_t)(uintptr_t)p[i]);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) DIE("fork");
    if (pid == 0) {
        void *c[3];
        for (int i = 0; i < 3; i++) {
            cudaError_t e = cudaMalloc(&c[i], (size_t)(i + 1) * MiB);
            if (e) {
                fprintf(stderr, "child cudaMalloc: %s\n", cudaGetErrorString(e));
                _exit(3);
            }
        }
        for (int i = 0; i < 3; i++)
            if (cudaFree(c[i])) _exit(4);
        fflush(stdout);
        dup2(2, 1); /* keep the parent's stdout to its own checksum line */
        char *args[] = {leak_path, "--n", "4", NULL};
        execv(leak_path, args);
        perror("execv");
        _exit(5);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) DIE("waitpid");
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    ck_add(&ck, (uint64_t)ok);
    ck_print(&ck);
    return ok ? 0 : 1;
}
