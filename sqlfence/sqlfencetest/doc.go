// Package sqlfencetest tests package sqlfence against real databases: a
// PostgreSQL server each run starts itself (initdb and postgres in a
// temporary directory, on a free loopback port, as an unprivileged user
// when run as root) and SQLite (modernc.org/sqlite, in pure Go). It is a
// module of its own so that the database drivers stay out of fencekv's
// dependencies. PostgreSQL's tests are skipped, with the reason, where no
// PostgreSQL server is installed (Debian: apt-get install postgresql).
package sqlfencetest
