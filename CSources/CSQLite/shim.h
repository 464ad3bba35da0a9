/* SQLite for Swift, plus the one macro Swift cannot see. */
#include <sqlite3.h>

/* SQLITE_TRANSIENT is a cast macro; Swift needs it as a value. */
static inline sqlite3_destructor_type herald_sqlite_transient(void) { return SQLITE_TRANSIENT; }
