#include "cfloor.h"
int hcf_dummy(void){return 0;}
