/* The device table (shim/devices.h) and the devices lock. */
#include <pthread.h>

#include "devices.h"

ps_device_state_t ps_devices_table[PS_MAX_DEVICES];
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;

void ps_devices_lock(void) { pthread_mutex_lock(&devices_lock); }
void ps_devices_unlock(void) { pthread_mutex_unlock(&devices_lock); }
bool ps_devices_trylock(void) { return pthread_mutex_trylock(&devices_lock) == 0; }
void ps_devices_lock_reinit(void) { pthread_mutex_init(&devices_lock, NULL); }

/* A report written while the program runs (the live page, shim/live.c)
 * reads every device's state and what its dropped stacks took: under the
 * devices lock, as a context reset writes them (lifecycle.c, drop_device). */
void ps_devices_report_begin(void) { ps_devices_lock(); }
void ps_devices_report_end(void) { ps_devices_unlock(); }
