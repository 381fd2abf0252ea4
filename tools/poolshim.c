/* STUB: the poolshim CLI (replaced by the tools work). */
#include <stdio.h>
int main(void) { fprintf(stderr, "poolshim: not built yet\n"); return 2; }
