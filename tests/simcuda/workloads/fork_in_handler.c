/* fork_in_handler: a signal handler forks while the thread is inside a driver call (and so
 * inside vramhook's hook around it), and both processes go on from there. Run with
 * VRAMHOOK_SIM_RAISE_AT_BYTES=8388608: the simulated driver raises SIGUSR1 inside the 8 MiB
 * cudaMalloc; the handler forks. The child returns through the driver and the hook, allocates and frees
 * 1 MiB, and exits 0; the parent waits and exits 0 only if the child did (a crash of the
 * child, in the hook it was forked in, shows as its signal).
 * Leaves live at exit: parent 4 + 8 MiB (the 8 MiB call is the parent's: the driver made it
 * before the fork); the child nothing (its 1 MiB is freed). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "sim_cuda_runtime.h"

static volatile sig_atomic_t child_pid = -1;

static void on_usr1(int sig) {
    (void)sig;
    child_pid = fork();
}

int main(void) {
    cksum_t ck;
    ck_init(&ck);
    handle_signal(SIGUSR1, on_usr1);
    void *first = NULL, *second = NULL;
    if (cudaMalloc(&first, 4 * MiB)) DIE("cudaMalloc 4 MiB");
    fflush(stdout);
    cudaError_t e = cudaMalloc(&second, 8 * MiB);
    if (child_pid < 0) DIE("fork in the handler failed or the signal never came (VRAMHOOK_SIM_RAISE_AT_BYTES=8388608?)");
    if (child_pid == 0) {
        void *c = NULL;
        if (e || cudaMalloc(&c, MiB) || cudaFree(c)) _exit(3);
        _exit(0);
    }
    if (e) DIE("cudaMalloc 8 MiB: %s", cudaGetErrorString(e));
    int st = 0;
    if (waitpid(child_pid, &st, 0) != child_pid) DIE("waitpid");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child %s %d\n", WIFSIGNALED(st) ? "killed by signal" : "exited", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        return 1;
    }
    ck_add(&ck, (uint64_t)(uintptr_t)first);
    ck_add(&ck, (uint64_t)(uintptr_t)second);
    ck_print(&ck);
    return 0;
}
