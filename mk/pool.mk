# The pool's thread stress test under ThreadSanitizer (Criterion cannot start
# under TSan: Snaipe/Criterion#274, so this is a plain program).
#   make pool-thread-stress
.PHONY: pool-thread-stress
pool-thread-stress:
	$(MAKE) SANITIZE=thread build-thread/libpoolshim_core.a
	$(CC) -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -fsanitize=thread -pthread \
	    -o build-thread/pool_thread_stress tests/stress/pool_thread_stress.c build-thread/libpoolshim_core.a
	TSAN_OPTIONS=halt_on_error=1 ./build-thread/pool_thread_stress
