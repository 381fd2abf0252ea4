/* Checks shim/cuda_abi.h against the CUDA toolkit's own headers: every
 * constant and size the shim writes out by hand must match. Built only
 * when the toolkit is installed. */
#include <stdio.h>

extern const long ps_abi_ours[], ps_abi_cuda[];
extern const char *const ps_abi_names[];
#include <stdint.h>
#include "abi_list.h"
#define X(v) +1
enum { COUNT = 0 PS_ABI_VALUES(X) };

int main(void)
{
    int bad = 0;
    for (int i = 0; i < COUNT; i++)
        if (ps_abi_ours[i] != ps_abi_cuda[i]) {
            printf("MISMATCH %s: ours %ld, CUDA's %ld\n", ps_abi_names[i], ps_abi_ours[i], ps_abi_cuda[i]);
            bad++;
        }
    printf("%d of %d ABI values match CUDA's headers\n", COUNT - bad, COUNT);
    return bad != 0;
}
