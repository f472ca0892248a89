/* free_reuse: one thread frees a block and another is handed the same address while the
 * freeing thread is still inside cudaFree: the driver has released the block, but the call
 * has not returned (here a signal handler runs there and waits until the other thread has
 * allocated; on a real machine, the freeing thread losing its CPU). A hook that stamped the
 * free after the call would stamp it later than the allocation that reuses its address,
 * and the allocation would be read first. Run with VRAMHOOK_SIM_REUSE_VA=1 and
 * VRAMHOOK_SIM_RAISE_AT_FREE_BYTES=3145728 (the 3 MiB block).
 * Leaves live at exit: the other thread's 3 MiB, at the freed block's address. */
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>

#include "common.h"
#include "sim_cuda_runtime.h"

#define BLOCK (3 * MiB)

static sem_t freed;
static atomic_int allocated;

static void on_usr1(int sig) {
    (void)sig;
    sem_post(&freed); /* async-signal-safe */
    while (!atomic_load(&allocated)) {
    }
}

static void *other_thread(void *arg) {
    void **out = arg;
    while (sem_wait(&freed) != 0) {
    }
    if (cudaMalloc(out, BLOCK)) *out = NULL;
    atomic_store(&allocated, 1);
    return NULL;
}

int main(void) {
    cksum_t ck;
    ck_init(&ck);
    handle_signal(SIGUSR1, on_usr1);
    if (sem_init(&freed, 0, 0)) DIE("sem_init");
    void *block = NULL, *again = NULL;
    if (cudaMalloc(&block, BLOCK)) DIE("cudaMalloc 3 MiB");
    pthread_t other;
    if (pthread_create(&other, NULL, other_thread, &again)) DIE("pthread_create");
    if (cudaFree(block)) DIE("cudaFree");
    if (!atomic_load(&allocated)) DIE("the signal never came (VRAMHOOK_SIM_RAISE_AT_FREE_BYTES=3145728?)");
    pthread_join(other, NULL);
    if (!again) DIE("the other thread's cudaMalloc failed");
    if (again != block) DIE("the address was not reused (VRAMHOOK_SIM_REUSE_VA=1?)");
    ck_add(&ck, (uint64_t)(uintptr_t)again);
    ck_print(&ck);
    return 0;
}
