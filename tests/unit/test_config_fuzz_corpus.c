/* Replays every committed fuzz corpus file (tests/data/fuzz/config/ and
 * tests/data/fuzz/size/) through the fuzzing entry points, so inputs the
 * fuzzer once found interesting keep being checked on the CPU suite. An
 * entry point traps on a broken invariant, which fails the test. */
#include "fuzz_corpus.h"

#include "../../config/config_internal.h"

Test(config_fuzz_corpus, every_config_corpus_file_replays_cleanly)
{
    ps_verbosity = -1;
    cr_assert_geq(fuzz_corpus_replay("config", ps_config_fuzz_ini), 30);
}

Test(config_fuzz_corpus, every_size_corpus_file_replays_cleanly)
{
    ps_verbosity = -1;
    cr_assert_geq(fuzz_corpus_replay("size", ps_config_fuzz_size), 10);
}
