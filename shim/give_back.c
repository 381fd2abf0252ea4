/* The give-back thread: free memory goes back to the device while the
 * program runs, without any call from it (global.decay_ms; the rule is the
 * pool's, core/pool_decay.c), and neighbour processes that ran out of
 * memory are answered at once (shim/neighbours.c).
 *
 * 1. Started once, by the first device stack built (router.c), when
 *    decay_ms > 0 or neighbour_release is on; never from a constructor. It
 *    blocks every signal (the program's handlers run on its own threads).
 *    Its first step makes the neighbours' registry entry (off the first
 *    allocation's path: see give_back_main).
 * 2. Every tick (a quarter of decay_ms, at least 10 ms) it calls
 *    ps_give_back_device(d, now, decay - tick) for every device whose stack is
 *    ready: the pool's decay on the device stack and on the pinned host
 *    stack, inside the give-back gate (ps_gpu_ops_cuda_give_back_enter:
 *    refused while a stream capture is open on the device, so the barrier
 *    the decay may record never lands in a capture, and no capture begins
 *    half-way). The pool takes its lock only if it is free, never
 *    synchronizes the device and never waits on the host.
 * 3. Between ticks it sleeps in poll() on a wake pipe and on the
 *    neighbours' socket (ps_neighbours_fd), so a request is served at once
 *    (ps_neighbours_serve) and a stop is prompt.
 * 3a. It also publishes the live statistics every PS_LIVE_PERIOD_MS in the
 *    registry (shim/live.c; neighbour_release on), the first at once:
 *    poll() waits for whichever comes first, the next tick or the next
 *    page (also when decay_ms is 0); without a usable registry, no more.
 * 4. Stops at exit: exit_begins (lifecycle.c) calls ps_give_back_stop, which
 *    wakes and joins it before the CUDA runtime's teardown; a tick in
 *    progress finishes first; then the live page and the registry entry
 *    go. A forked child has no such thread and starts none (its devices
 *    are marked failed). A context reset makes the
 *    device's GPU-ops table dead (no CUDA call) and its stack stays
 *    allocated, so a tick racing a reset touches nothing freed.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "give.h"
#include "give_back.h"
#include "live.h"
#include "neighbours.h"

static pthread_t thread;
static atomic_int started;  /* 1 once the thread runs (or failed to start) */
static atomic_int stopping; /* 1: leave at the next wake */
static int wake_pipe[2] = {-1, -1};

static void *give_back_main(void *arg)
{
    (void)arg;
    /* The registry entry is made here, not by ps_give_back_start: its
     * directory scan, socket and file would otherwise add to the first
     * allocation's time. A neighbour that looks in the meantime does not
     * find this process yet,
     * which holds almost nothing free so early. (A failure there leaves the
     * decay running.) */
    uint64_t t0 = ps_now_ns();
    if (ps_neighbours_open() == PS_OK)
        ps_info("neighbours: registry entry made in %.0f us (on the give-back thread)", (ps_now_ns() - t0) / 1e3);
    uint64_t decay_ns = ps_global_config()->decay_ms * 1000000ull;
    int tick_ms = (int)(ps_global_config()->decay_ms / 4);
    if (tick_ms < 10)
        tick_ms = 10; /* (no upper bound: the pool's ring holds 8 ticks, two windows) */
    /* the window the pool looks back over: one tick less than the decay, so
     * that the tick that finds the pool idle comes at most decay_ms after
     * its last allocation (core/pool_decay.c: keep and idleness over the window) */
    uint64_t window_ns = decay_ns > (uint64_t)tick_ms * 1000000ull ? decay_ns - (uint64_t)tick_ms * 1000000ull
                                                                  : decay_ns;
    uint64_t next_tick = ps_now_ns() + (uint64_t)tick_ms * 1000000ull;
    const uint64_t publish_ns = PS_LIVE_PERIOD_MS * 1000000ull;
    int publish = 1; /* 3a. (the first call finds whether there is a registry) */
    uint64_t next_publish = ps_now_ns();
    while (!atomic_load(&stopping) && !ps_process_exiting()) {
        struct pollfd fds[2] = {{wake_pipe[0], POLLIN, 0}, {ps_neighbours_fd(), POLLIN, 0}};
        uint64_t now = ps_now_ns();
        int wait_ms = !decay_ns ? -1 : now >= next_tick ? 0 : (int)((next_tick - now) / 1000000ull);
        if (publish) {
            int publish_wait = now >= next_publish ? 0 : (int)((next_publish - now + 999999) / 1000000ull);
            if (wait_ms < 0 || publish_wait < wait_ms)
                wait_ms = publish_wait;
        }
        int n = poll(fds, fds[1].fd >= 0 ? 2 : 1, wait_ms);
        if (atomic_load(&stopping) || ps_process_exiting())
            break;
        if (n > 0 && (fds[1].revents & POLLIN))
            ps_neighbours_serve();
        now = ps_now_ns();
        if (decay_ns && now >= next_tick) {
            for (int d = 0; d < PS_MAX_DEVICES; d++)
                ps_give_back_device(d, now, window_ns, 0, NULL);
            next_tick = now + (uint64_t)tick_ms * 1000000ull;
        }
        if (publish && now >= next_publish) {
            publish = ps_live_publish();
            next_publish = now + publish_ns;
        }
    }
    return NULL;
}

void ps_give_back_start(void)
{
    int never = 0; /* (an exchange would turn a running thread's 2 back into 1 at the second device's
                      stack, and the thread would be neither stopped nor joined at exit) */
    if (!atomic_compare_exchange_strong(&started, &never, 1) || !ps_global_config() ||
        (!ps_global_config()->decay_ms && !ps_global_config()->neighbour_release))
        return;
    if (pipe(wake_pipe) != 0) {
        ps_warning("cannot start the give-back thread (pipe: %s): free memory stays in the pool until exit",
                   strerror(errno));
        return;
    }
    uint64_t t0 = ps_now_ns();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&thread, NULL, give_back_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        ps_warning("cannot start the give-back thread (%s): free memory stays in the pool until exit", strerror(rc));
        close(wake_pipe[0]);
        close(wake_pipe[1]);
        wake_pipe[0] = wake_pipe[1] = -1;
        return;
    }
    pthread_setname_np(thread, "poolshim-give");
    atomic_store(&started, 2);
    ps_info("give-back thread started in %.0f us", (ps_now_ns() - t0) / 1e3);
}

void ps_give_back_stop(void)
{
    if (atomic_load(&started) != 2 || atomic_exchange(&stopping, 1))
        return;
    char one = 1;
    ssize_t w = write(wake_pipe[1], &one, 1);
    (void)w;
    pthread_join(thread, NULL);
    ps_live_remove();
    ps_neighbours_close();
}

void ps_give_back_atfork_child(void)
{
    /* the thread did not come along; the child serves no one */
    if (atomic_load(&started) == 2) {
        atomic_store(&stopping, 1);
        atomic_store(&started, 3);
    }
}
