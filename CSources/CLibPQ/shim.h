/* libpq (Debian libpq-dev) for Swift. Its headers live in /usr/include/postgresql;
 * libpq-fe.h finds its neighbours (postgres_ext.h) next to itself. */
#include <postgresql/libpq-fe.h>
