/* STUB */
#include "config.h"
