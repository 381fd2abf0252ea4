/* poolshim_version() (shim/poolshim.h): the version of this libpoolshim.so,
 * from the file VERSION (mk/version.mk passes it as POOLSHIM_VERSION). */
#include "common.h"
#include "poolshim.h"

#ifndef POOLSHIM_VERSION
#error "POOLSHIM_VERSION is not defined: build with make (mk/version.mk reads the file VERSION)"
#endif

PS_EXPORT const char *poolshim_version(void) { return POOLSHIM_VERSION; }
