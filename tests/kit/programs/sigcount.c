/* The signal counter of the signal tests (cli/tests/run_signals.rs, tests/safety/tests/
 * signals.rs), built by vramhook_testkit::sigcount(). "count": counts SIGINTs (blocked
 * but while it waits) and exits with 10 + the count at SIGTERM; otherwise it keeps the
 * dispositions it was given and waits to die of what kills it. Its first line says
 * "ready", its pid, its parent's and its SIGINT disposition as it found it. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static volatile sig_atomic_t ints, term;
static void on_int(int s) { (void)s; ints++; }
static void on_term(int s) { (void)s; term = 1; }
int main(int argc, char **argv) {
    int count = argc > 1 && strcmp(argv[1], "count") == 0;
    struct sigaction old;
    sigaction(SIGINT, NULL, &old);
    const char *disp = old.sa_handler == SIG_IGN ? "ign" : "dfl";
    if (!count) {
        printf("ready pid=%d ppid=%d int=%s\n", (int)getpid(), (int)getppid(), disp); fflush(stdout);
        for (;;) pause();
    }
    sigset_t block, empty;
    sigemptyset(&block); sigaddset(&block, SIGINT); sigaddset(&block, SIGTERM);
    sigemptyset(&empty);
    sigprocmask(SIG_BLOCK, &block, NULL);
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int; sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_term; sigaction(SIGTERM, &sa, NULL);
    printf("ready pid=%d ppid=%d int=%s\n", (int)getpid(), (int)getppid(), disp); fflush(stdout);
    int said = 0;
    while (!term) {
        sigsuspend(&empty);
        while (said < ints) { said++; printf("int %d\n", said); fflush(stdout); }
    }
    return 10 + ints;
}
