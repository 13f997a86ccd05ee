/* logging.h (ThreadSanitizer build only): cr_log_* come with criterion.h here. */
#include "criterion.h"
